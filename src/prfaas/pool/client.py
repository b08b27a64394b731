"""``PoolClient``: a tenant's calls to a pool's front door (API v1, ``docs/pool.md``).

Every call is signed with the tenant's key (``serve.auth.signed_headers``: HMAC over method, host,
path, body digest, timestamp, nonce and the key id, named in ``X-Prfaas-Key-Id``). The front door
does not MAC its answers (tenant keys sign calls; answers are read over the API's own transport,
TLS once wired), so this is not ``SignedAuth``. Every answer's epoch comes back with it. An
answer that cannot be had (connect refused, timeout, a 5xx) is ``PoolUnreachable``; a refusal is
a ``Refusal`` with its reason (``error.code``) and retry hint, never an exception. The feedback
is read into ``Feedback`` (with ``LinkFeedback``, the tenant's own link at the pool: what it
told with its receivers, what the pool's nodes read of it, ``PoolShapeFeedback``, the
groups' node counts and the egress its tuner plans with, and, per group, what the pool's nodes
hold of its prefixes, read into the door's own type, ``pool.tenant_prefixes.GroupPrefixes``); a
door older than those fields gives ``link``, ``pool`` and ``prefixes`` None.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import httpx

from prfaas.pool.tenant_prefixes import GroupPrefixes
from prfaas.serve.auth import signed_headers

CALL_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 16
"""A tenant's connections to the front door at most (kept alive): a burst of submits opens them
all at once, and each counts against the door's quota of unverified connections until its first
signed call is checked; the door makes room for this many per tenant (``pool.service``)."""


class PoolUnreachable(Exception):
    """No usable answer from the front door."""


class _TenantAuth(httpx.Auth):
    requires_request_body = True

    def __init__(self, key_id: str, key: bytes) -> None:
        self.key_id = key_id
        self._key = key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.update(
            signed_headers(
                self._key,
                request.method,
                request.headers["host"],
                request.url.raw_path.decode("ascii"),
                request.content,
                time.time(),
                key_id=self.key_id,
            )
        )
        yield request


@dataclass(frozen=True, slots=True)
class Accepted:
    epoch: int
    group: str
    expected_start_in_s: float


@dataclass(frozen=True, slots=True)
class LinkReadingFeedback:
    """The pool's nodes' reading of the tenant's own link (modelled units, like the tenant's)."""

    pace_gbps: float | None
    """The rate its KV is paced at per tenant (None: not paced per tenant)."""
    capacity_gbps: float
    """The senders' capacity estimate (``basis``: "measured", "configured" or "": none)."""
    basis: str
    backlog_bytes: int
    """KV sent towards the tenant's receivers and not yet acknowledged."""
    rtt_s: float
    """0: unknown."""
    retransmit_rate: float
    num_senders: int


@dataclass(frozen=True, slots=True)
class LinkFeedback:
    gbps: float | None
    """The rate this tenant registered (None: it told none)."""
    rtt_ms: float | None
    reading: LinkReadingFeedback | None
    """None: no pool node has sent to this tenant yet (or none is live)."""


@dataclass(frozen=True, slots=True)
class PoolShapeFeedback:
    """The pool's shape as its feedback says it: what a tenant's tuner plans with."""

    egress_gbps: float
    """The pool's total egress (modelled Gbps)."""
    groups: tuple[tuple[str, int], ...]
    """(model, nodes) per group."""

    @property
    def egress_bytes_per_s(self) -> float:
        return self.egress_gbps * 1e9 / 8

    def num_nodes_for(self, model: str) -> int | None:
        """The nodes of the group serving ``model`` (None: no such group)."""
        return next((n for m, n in self.groups if m == model), None)


@dataclass(frozen=True, slots=True)
class Feedback:
    """``GET /v1/feedback``: this tenant's own figures at the pool."""

    epoch: int
    tenant: str
    expected_queueing_s: float
    entitled_share: float
    attainable_share: float
    queued_tokens: int
    running: int
    link_backlog_s: float = 0.0
    """Its unsent KV at the pool over its own link's rate (0: none, or no rate told)."""
    link: LinkFeedback | None = None
    """None: a front door that does not say."""
    pool: PoolShapeFeedback | None = None
    """None: a front door that does not say (a tenant's tuner then keeps its ``t``)."""
    prefixes: tuple[GroupPrefixes, ...] | None = None
    """Per group; None: a front door that does not say."""

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Feedback:
        """Read an answer; a missing or malformed field is a ``ValueError`` naming it."""
        try:
            link, pool, prefixes = raw.get("link"), raw.get("pool"), raw.get("prefixes")
            return cls(
                epoch=int(raw["epoch"]),
                tenant=str(raw["tenant"]),
                expected_queueing_s=float(raw["expected_queueing_s"]),
                entitled_share=float(raw["entitled_share"]),
                attainable_share=float(raw["attainable_share"]),
                queued_tokens=int(raw["queued_tokens"]),
                running=int(raw["running"]),
                link_backlog_s=float(raw.get("link_backlog_s", 0.0)),
                link=None if link is None else _link_feedback(link),
                pool=None if pool is None else _pool_shape(pool),
                prefixes=None
                if prefixes is None
                else tuple(GroupPrefixes.from_json(p) for p in prefixes),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"feedback: {type(exc).__name__}: {exc}") from None


def _pool_shape(raw: dict[str, Any]) -> PoolShapeFeedback:
    groups = tuple((str(g["model"]), int(g["num_nodes"])) for g in raw["groups"])
    return PoolShapeFeedback(egress_gbps=float(raw["egress_gbps"]), groups=groups)


def _link_feedback(raw: dict[str, Any]) -> LinkFeedback:
    r = raw.get("reading")
    reading = None
    if r is not None:
        pace = r.get("pace_gbps")
        reading = LinkReadingFeedback(
            pace_gbps=None if pace is None else float(pace),
            capacity_gbps=float(r["capacity_gbps"]),
            basis=str(r["basis"]),
            backlog_bytes=int(r["backlog_bytes"]),
            rtt_s=float(r["rtt_s"]),
            retransmit_rate=float(r["retransmit_rate"]),
            num_senders=int(r["num_senders"]),
        )
    gbps, rtt_ms = raw.get("gbps"), raw.get("rtt_ms")
    return LinkFeedback(
        gbps=None if gbps is None else float(gbps),
        rtt_ms=None if rtt_ms is None else float(rtt_ms),
        reading=reading,
    )


@dataclass(frozen=True, slots=True)
class Refusal:
    epoch: int | None
    status: int
    reason: str
    """The answer's ``error.code`` (``over_queued_tokens_cap``, ``wrong_tenant``, ...)."""
    message: str
    retry_after_s: float | None


def pool_verify(ca: str | None) -> ssl.SSLContext | bool:
    """What an https pool URL's certificate is checked against: the CA file, else the system's."""
    return True if ca is None else ssl.create_default_context(cafile=ca)


class PoolClient:
    def __init__(
        self,
        url: str,
        key_id: str,
        key: bytes,
        timeout_s: float = CALL_TIMEOUT_S,
        verify: ssl.SSLContext | bool = True,
        server_hostname: str | None = None,
    ):
        """``verify``, ``server_hostname``: an https URL's certificate is checked against
        ``verify`` (``pool_verify``) under ``server_hostname`` (None: the URL's host)."""
        self.url = url.rstrip("/")
        hooks: dict[str, list[Any]] = {}
        if server_hostname is not None:

            async def named(request: httpx.Request) -> None:
                request.extensions["sni_hostname"] = server_hostname

            hooks["request"] = [named]
        self._client = httpx.AsyncClient(
            base_url=self.url,
            auth=_TenantAuth(key_id, key),
            timeout=timeout_s,
            trust_env=False,
            verify=verify,
            event_hooks=hooks,
            limits=httpx.Limits(
                max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
            ),
        )

    async def _call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        try:
            if body is None:
                r = await self._client.request(method, path)
            else:
                r = await self._client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise PoolUnreachable(f"{self.url}{path}: {type(exc).__name__}: {exc}") from None
        if r.status_code >= 500:
            raise PoolUnreachable(f"{self.url}{path}: HTTP {r.status_code}")
        return r

    async def register(
        self, receivers: list[dict[str, Any]], link: tuple[float, float] | None = None
    ) -> dict[str, Any] | Refusal:
        """``receivers``: ``{name, host, transfer_port}`` each; ``link``: the tenant's own link
        from the pool, (modelled Gbps, RTT ms), paced per tenant at the pool's nodes (None:
        not said, only the pool's egress paces it); renews the lease."""
        body: dict[str, Any] = {"receivers": receivers}
        if link is not None:
            body["link"] = {"gbps": link[0], "rtt_ms": link[1]}
        return _answer(await self._call("POST", "/v1/receivers", body))

    async def heartbeat(self) -> dict[str, Any] | Refusal:
        return _answer(await self._call("POST", "/v1/heartbeat", {}))

    async def submit(self, body: dict[str, Any]) -> Accepted | Refusal:
        answer = _answer(await self._call("POST", "/v1/submit", body))
        if isinstance(answer, Refusal):
            return answer
        acc = answer["accepted"]
        return Accepted(int(answer["epoch"]), str(acc["group"]), float(acc["expected_start_in_s"]))

    async def outcome(self, request_id: str) -> dict[str, Any] | Refusal:
        return _answer(await self._call("GET", f"/v1/outcome/{request_id}"))

    async def abort(self, request_id: str) -> dict[str, Any] | Refusal:
        return _answer(await self._call("POST", f"/v1/abort/{request_id}"))

    async def feedback(self) -> Feedback | Refusal:
        """This tenant's feedback; an answer that does not parse is a ``ValueError`` naming the
        field (the door answered: it is not unreachable)."""
        answer = _answer(await self._call("GET", "/v1/feedback"))
        if isinstance(answer, Refusal):
            return answer
        return Feedback.from_json(answer)

    async def aclose(self) -> None:
        await self._client.aclose()


def _answer(r: httpx.Response) -> dict[str, Any] | Refusal:
    try:
        body = r.json()
    except ValueError:
        raise PoolUnreachable(f"HTTP {r.status_code}: not JSON") from None
    if r.status_code == 200 and isinstance(body, dict):
        return body
    err = body.get("error", {}) if isinstance(body, dict) else {}
    epoch = body.get("epoch") if isinstance(body, dict) else None
    retry = body.get("retry_after_s") if isinstance(body, dict) else None
    return Refusal(
        epoch=int(epoch) if epoch is not None else None,
        status=r.status_code,
        reason=str(err.get("code") or f"http_{r.status_code}"),
        message=str(err.get("message", "")),
        retry_after_s=float(retry) if retry is not None else None,
    )
