"""The pool front door's tenant API, version 1 (``docs/pool.md``): a FastAPI app over ``FrontDoor``.

Every call is signed by a tenant key (``serve.auth``'s HMAC over method, host, path, body digest,
timestamp and nonce) and names the key in ``X-Prfaas-Key-Id``; the key id names the tenant, and
the tenant is the caller for ``FrontDoor`` (a body naming another tenant is refused 403). A missing
or unknown key id, or a signature that does not verify, is a 401 with an OpenAI-style error body.
The tenant keys are one ``serve.keyring.Keyring`` (key id -> key) under one ``serve.auth.Verifier``
(one nonce memory for the door); ``TenantKeys`` adds key id -> tenant. The key id is signed, so a
tenant cannot borrow another's id with its own key.

Routes: ``/v1/receivers`` (with the tenant's own link rate, optional: a caller that does not
send it is paced by the pool's egress alone), ``/v1/heartbeat``, ``/v1/submit``,
``/v1/outcome/{id}``, ``/v1/abort/{id}`` (the tenant's client went away), ``/v1/feedback``
(with the tenant's own link: what it told and what the pool's nodes read of it; the pool's
shape, each group's node count and the egress, for the tenant's tuner; and its prefixes at the
pool's nodes, its own namespace per group: ``pool.tenant_prefixes``). Fields added to
v1 are optional in what it reads and extra in what it answers, so v1 callers keep working. TLS
is the listener's (``pool.service``, ``front_door.tls``), not this app's.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prfaas.policy.pool_admission import Accepted, EgressState
from prfaas.policy.pool_shares import PoolShape
from prfaas.pool.frontdoor import FrontDoor, Receiver, Submit
from prfaas.pool.payload import Payload
from prfaas.pool.tenant_links import LinkReading, TenantLink, link_json
from prfaas.pool.tenant_prefixes import GroupPrefixes, prefixes_json
from prfaas.serve.auth import KEY_ID_HEADER, Refusal, Verifier, refusal_body
from prfaas.serve.auth_middleware import CONNECTION_EXTENSION
from prfaas.serve.internal_errors import error_response, install
from prfaas.serve.keyring import Keyring
from prfaas.serve.node.messages import SamplingMsg, unpack_tokens

_M = TypeVar("_M", bound=BaseModel)


class TenantKeys:
    """Key id -> (tenant, key): one keyring, verified by one ``Verifier``."""

    def __init__(self, keys: Mapping[str, tuple[str, bytes]]) -> None:
        self.verifier = Verifier(_ring(keys))
        self._tenants = {kid: tenant for kid, (tenant, _) in keys.items()}

    def tenant(self, key_id: str) -> str | None:
        """The key's tenant; None for a key a reload removed while its call was being read."""
        return self._tenants.get(key_id)

    def replace(self, keys: Mapping[str, tuple[str, bytes]]) -> None:
        """A reload: calls signed with a key id no longer listed are refused (401) from the next
        one on; the verifier's nonce memory is kept (a replay stays a replay)."""
        ring = _ring(keys)
        self._tenants = {kid: tenant for kid, (tenant, _) in keys.items()}
        self.verifier.keys.replace(ring)

    def key_ids(self) -> dict[str, list[str]]:
        """Tenant -> its accepted key ids (what the operator's listener shows)."""
        out: dict[str, list[str]] = {}
        for kid, tenant in sorted(self._tenants.items()):
            out.setdefault(tenant, []).append(kid)
        return out


def _ring(keys: Mapping[str, tuple[str, bytes]]) -> Keyring:
    if not keys:
        raise ValueError("the pool needs at least one tenant key")
    return Keyring({kid: key for kid, (_, key) in keys.items()}, signing_id=min(keys))


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReceiverBody(_Body):
    name: str = Field(min_length=1, max_length=128)
    host: str = Field(min_length=1, max_length=255)
    transfer_port: int = Field(ge=1, le=65535)


class LinkBody(_Body):
    """The tenant's own link from the pool (its file's ``pool.link``)."""

    gbps: float = Field(gt=0, allow_inf_nan=False, description="modelled Gbps")
    rtt_ms: float = Field(0.0, ge=0, allow_inf_nan=False)


class ReceiversBody(_Body):
    receivers: list[ReceiverBody] = Field(max_length=1024)
    link: LinkBody | None = None
    """None (an older caller): the tenant's KV is not paced per tenant, only the egress cap."""


class SubmitBody(_Body):
    tenant: str
    request_id: str = Field(min_length=1, max_length=256)
    model: str
    fingerprint: dict[str, str] = {}
    num_uncached_tokens: int = Field(ge=1)
    receiver: str
    session: str = Field(min_length=1, max_length=256)
    tokens: str = Field(min_length=1, description="the prompt, pack_tokens-encoded")
    sampling: SamplingMsg = SamplingMsg(max_new_tokens=1)
    """The decode side's sampling: the pool node computes the first token with it."""
    receiver_cached_tokens: int = Field(0, ge=0, description="prefix the decode node holds")
    decode_recomputes_last_token: bool = False


Costs = Callable[[str, int], tuple[float, int] | None]
"""(model, uncached tokens) -> (compute_s on the model's group, KV bytes), None: not served."""


def create_app(
    door: FrontDoor,
    keys: TenantKeys,
    costs: Costs,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    on_accepted: Callable[[Payload], None] | None = None,
    on_abort: Callable[[str, str], bool] | None = None,
    egress: Callable[[], EgressState] | None = None,
    link_reading: Callable[[str], LinkReading | None] | None = None,
    prefixes: Callable[[str], tuple[GroupPrefixes, ...]] | None = None,
    wall_s_per_modelled_s: float = 1.0,
) -> FastAPI:
    """``on_accepted``: told each accepted submit's ``Payload`` (the placement driver keeps it
    until the prefill is placed); ``on_abort(tenant, request_id)``: carries out a tenant's abort
    (the driver: drop it, or stop it at its node), False when there is no such prefill (without
    one, the door alone drops it); ``egress`` and ``link_reading(tenant)``: the driver's egress
    state and its nodes' reading of a tenant's link, for the feedback (without them: no link
    backlog, no reading); ``prefixes(tenant)``: what the nodes hold for it, per group (without
    it: none said); ``clock`` is the admission's (modelled seconds live), and every figure in
    a JSON body is on it but ``lease_s``; ``wall_s_per_modelled_s`` converts to the wall seconds
    HTTP's ``Retry-After`` and the heartbeat's ``lease_s`` are in (a tenant renews by its own
    wall clock, and a plain HTTP client sleeps on the header)."""
    app = FastAPI(title="prfaas pool front door", version="1")
    install(app)

    async def caller(request: Request) -> str | JSONResponse:
        verified = await signed(request)
        return verified if isinstance(verified, JSONResponse) else verified[0]

    async def signed(request: Request) -> tuple[str, str] | JSONResponse:
        """(tenant, key id) of a verified call, or the 401."""
        headers = {k.decode("latin-1").lower(): v for k, v in request.scope["headers"]}
        target = request.scope.get("raw_path") or request.url.path.encode()
        if request.scope.get("query_string"):
            target += b"?" + request.scope["query_string"]
        verifier = keys.verifier
        # The signature is checked before the body is read (an unsigned flood costs no body).
        verified = verifier.authenticate(request.method.encode(), target, headers, wall())
        if not isinstance(verified, Refusal):
            body = await request.body()
            refused = verifier.verify_body(verified, hashlib.sha256(body).hexdigest().encode())
            if refused is None:
                # The listener takes a verified connection out of its unverified quota.
                handle = request.scope.get("extensions", {}).get(CONNECTION_EXTENSION)
                if handle is not None:
                    handle.verified()
                tenant = keys.tenant(verified.key_id)
                if tenant is not None:
                    return tenant, verified.key_id
                refused = Refusal("unknown_key", f"key id {verified.key_id!r} was revoked",
                                  KEY_ID_HEADER)  # fmt: skip
            verified = refused
        verifier.note(verified)
        return JSONResponse(content=_json(refusal_body(verified)), status_code=401)

    @app.post("/v1/receivers")
    async def receivers(request: Request) -> Any:
        tenant = await caller(request)
        if isinstance(tenant, JSONResponse):
            return tenant
        body = _parse(ReceiversBody, await request.body())
        if isinstance(body, JSONResponse):
            return body
        recs = tuple(Receiver(r.name, r.host, r.transfer_port) for r in body.receivers)
        link = None if body.link is None else TenantLink(body.link.gbps, body.link.rtt_ms)
        epoch = door.register(tenant, recs, clock(), link)
        return {"epoch": epoch, "registered": [r.name for r in recs]}

    @app.post("/v1/heartbeat")
    async def heartbeat(request: Request) -> Any:
        tenant = await caller(request)
        if isinstance(tenant, JSONResponse):
            return tenant
        lease_wall_s = door.lease_s * wall_s_per_modelled_s
        return {"epoch": door.heartbeat(tenant, clock()), "lease_s": lease_wall_s}

    @app.post("/v1/submit")
    async def submit(request: Request) -> Any:
        who = await signed(request)
        if isinstance(who, JSONResponse):
            return who
        tenant, key_id = who
        body = _parse(SubmitBody, await request.body())
        if isinstance(body, JSONResponse):
            return body
        try:
            num_tokens = len(unpack_tokens(body.tokens))
        except ValueError:
            num_tokens = -1
        if num_tokens < body.num_uncached_tokens:
            return error_response(
                400, f"tokens: {max(num_tokens, 0)} packed tokens, fewer than "
                f"num_uncached_tokens {body.num_uncached_tokens} (or not pack_tokens base64)",
                param="tokens", code="invalid_field",
            )  # fmt: skip
        cost = costs(body.model, body.num_uncached_tokens)
        compute_s, kv_bytes = cost if cost is not None else (0.0, 0)
        req = Submit(body.tenant, body.request_id, body.model,
                     tuple(sorted(body.fingerprint.items())), body.num_uncached_tokens,
                     body.receiver, body.session, compute_s, kv_bytes)  # fmt: skip
        ans = door.submit(tenant, req, clock())
        d = ans.decision
        if isinstance(d, Accepted):
            if on_accepted is not None:
                on_accepted(Payload(tenant, body.request_id, key_id, body.tokens, body.sampling,
                                    body.receiver_cached_tokens,
                                    body.decode_recomputes_last_token))  # fmt: skip
            return {"epoch": ans.epoch, "accepted": {"group": d.group,
                    "expected_start_in_s": max(0.0, d.expected_start_s - clock())}}  # fmt: skip
        resp = error_response(ans.status, d.detail, code=d.reason)
        content = _json(bytes(resp.body))
        content.update(epoch=ans.epoch, retry_after_s=d.retry_after_s)
        headers = None
        if d.retry_after_s:  # RFC 9110: whole seconds; rounded up so a client never comes early
            wall_s = math.ceil(d.retry_after_s * wall_s_per_modelled_s)
            headers = {"Retry-After": str(max(1, wall_s))}
        return JSONResponse(content, status_code=ans.status, headers=headers)

    @app.get("/v1/outcome/{request_id}")
    async def outcome(request: Request, request_id: str) -> Any:
        tenant = await caller(request)
        if isinstance(tenant, JSONResponse):
            return tenant
        out = door.outcome(tenant, request_id)
        if out is None:  # another tenant's id reads the same as an unknown one
            return error_response(404, f"no request {request_id!r}", code="unknown_request")
        return {"epoch": out.epoch, "request_id": out.request_id, "state": out.state,
                "reason": out.reason, "kv_bytes_sent": out.kv_bytes_sent,
                "cached_tokens": out.cached_tokens}  # fmt: skip

    @app.post("/v1/abort/{request_id}")
    async def abort(request: Request, request_id: str) -> Any:
        """The tenant's client went away: its queued or running prefill is given up on."""
        tenant = await caller(request)
        if isinstance(tenant, JSONResponse):
            return tenant
        if on_abort is not None:
            done = on_abort(tenant, request_id)
        else:
            done = door.abort(tenant, request_id, clock()) is not None
        if not done:  # another tenant's id reads the same as an unknown or ended one
            return error_response(
                404, f"no queued or running request {request_id!r}", code="unknown_request"
            )
        return {"epoch": door.epoch, "request_id": request_id, "state": "aborted"}

    @app.get("/v1/feedback")
    async def feedback(request: Request) -> Any:
        tenant = await caller(request)
        if isinstance(tenant, JSONResponse):
            return tenant
        fb = door.feedback(tenant, clock(), None if egress is None else egress())
        reading = None if link_reading is None else link_reading(tenant)
        return {
            "epoch": door.epoch,
            "tenant": fb.tenant,
            "expected_queueing_s": fb.expected_queueing_s,
            "entitled_share": fb.entitled_share,
            "attainable_share": fb.attainable_share,
            "queued_tokens": fb.queued_tokens,
            "running": fb.running,
            "link_backlog_s": fb.link_backlog_s,
            "link": link_json(door.link_of(tenant), reading),
            "pool": shape_json(door.shape),
            "prefixes": prefixes_json(() if prefixes is None else prefixes(tenant)),
        }

    return app


def shape_json(shape: PoolShape) -> dict[str, Any]:
    """What a tenant's tuner needs of the pool's shape (``policy.tuner_inputs``): each group's
    model and node count, and the egress (modelled Gbps); the same for every tenant."""
    return {
        "egress_gbps": shape.egress_bytes_per_s * 8 / 1e9,
        "groups": [{"model": g.model, "num_nodes": g.num_nodes} for g in shape.groups],
    }


def _json(raw: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(raw)
    return out


def _parse(model: type[_M], raw: bytes) -> _M | JSONResponse:
    """The body, checked after the signature (an unsigned caller learns nothing of the schema);
    a bad field is a 400 naming it."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        message = f"{field}: {first['msg']}" if field else f"invalid body: {first['msg']}"
        return error_response(400, message, param=field, code="invalid_field")
