"""``PoolClient``: a tenant's calls to a pool's front door (API v1, ``docs/pool.md``).

Every call is signed with the tenant's key (``serve.auth.signed_headers``: HMAC over method, host,
path, body digest, timestamp, nonce and the key id, named in ``X-Prfaas-Key-Id``). The front door
does not MAC its answers (tenant keys sign calls; answers are read over the API's own transport,
TLS once wired), so this is not ``SignedAuth``. Every answer's epoch comes back with it. An
answer that cannot be had (connect refused, timeout, a 5xx) is ``PoolUnreachable``; a refusal is
a ``Refusal`` with its reason (``error.code``) and retry hint, never an exception.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import httpx

from prfaas.serve.auth import signed_headers

CALL_TIMEOUT_S = 5.0


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
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
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

    async def register(self, receivers: list[dict[str, Any]]) -> dict[str, Any] | Refusal:
        """``receivers``: ``{name, host, transfer_port}`` each; renews the lease."""
        return _answer(await self._call("POST", "/v1/receivers", {"receivers": receivers}))

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

    async def feedback(self) -> dict[str, Any] | Refusal:
        return _answer(await self._call("GET", "/v1/feedback"))

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
