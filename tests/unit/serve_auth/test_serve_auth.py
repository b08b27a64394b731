"""Signed control-plane calls (``prfaas.serve.auth``): sign/verify, tampering, replay, clock skew,
the bounded nonce memory, and the ASGI middleware in front of a tiny app (in process)."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi import FastAPI, Request

from prfaas.serve.auth import (
    CONTENT_SHA256_HEADER,
    KEY_ID_HEADER,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Refusal,
    SignedAuth,
    signed_headers,
)
from prfaas.serve.auth import Verifier as _Verifier
from prfaas.serve.auth_middleware import SignatureMiddleware
from prfaas.serve.keyring import key_id_of

PSK = b"test-key-0123456789abcdef"
NOW_S = 1_800_000_000.0
BODY = b'{"process": "pd", "nodes": []}'
TARGET = "/internal/register?x=1"
STARTED_S = NOW_S - 3600.0


def Verifier(psk: bytes, **kw: float) -> _Verifier:  # the class, started an hour ago
    return _Verifier(psk, started_at_s=STARTED_S, **kw)  # type: ignore[arg-type]


def _signed(
    psk: bytes = PSK,
    method: str = "POST",
    host: str = "127.0.0.1:8001",
    target: str = TARGET,
    body: bytes = BODY,
    now_s: float = NOW_S,
    nonce: str | None = None,
) -> dict[str, bytes]:
    headers = signed_headers(psk, method, host, target, body, now_s, nonce)
    out = {k: v.encode() for k, v in headers.items()}
    out["host"] = host.encode()
    return out


def _verify(
    verifier: Verifier,
    headers: dict[str, bytes],
    method: bytes = b"POST",
    target: bytes = TARGET.encode(),
    body: bytes = BODY,
    now_s: float = NOW_S,
) -> Refusal | None:
    return verifier.verify(method, target, headers, body, now_s)


def test_a_signed_request_verifies() -> None:
    assert _verify(Verifier(PSK), _signed()) is None


@pytest.mark.parametrize(
    "change",
    [
        {"method": b"PUT"},
        {"target": b"/internal/heartbeat?x=1"},
        {"target": b"/internal/register?x=2"},
    ],
)
def test_any_change_to_the_request_breaks_the_signature(change: dict[str, bytes]) -> None:
    refusal = _verify(Verifier(PSK), _signed(), **change)  # type: ignore[arg-type]
    assert refusal is not None and refusal.code == "bad_signature"


@pytest.mark.parametrize("body", [BODY.replace(b"pd", b"pf"), BODY + b" ", b""])
def test_a_changed_body_does_not_match_its_signed_digest(body: bytes) -> None:
    refusal = _verify(Verifier(PSK), _signed(), body=body)
    assert refusal is not None and refusal.code == "body_mismatch"
    assert refusal.header == CONTENT_SHA256_HEADER


@pytest.mark.parametrize(
    "header, value",
    [
        ("host", b"127.0.0.1:9999"),
        (NONCE_HEADER, b"0" * 32),
        (TIMESTAMP_HEADER, f"{NOW_S + 1:.3f}".encode()),
        (SIGNATURE_HEADER, b"0" * 64),
        (CONTENT_SHA256_HEADER, b"0" * 64),
    ],
)
def test_any_changed_header_breaks_the_signature(header: str, value: bytes) -> None:
    headers = _signed()
    headers[header] = value
    refusal = _verify(Verifier(PSK), headers)
    assert refusal is not None and refusal.code == "bad_signature"


def test_a_wrong_key_is_refused() -> None:
    refusal = _verify(Verifier(PSK), _signed(psk=b"another-key-0123456789"))
    assert refusal is not None and refusal.code == "unknown_key"
    # Claiming the deployment key's id does not help: the signature does not match.
    headers = signed_headers(b"another-key-0123456789", "POST", "127.0.0.1:8001", TARGET, BODY,
                             NOW_S, key_id=key_id_of(PSK))  # fmt: skip
    forged = {k: v.encode() for k, v in headers.items()} | {"host": b"127.0.0.1:8001"}
    refusal = _verify(Verifier(PSK), forged)
    assert refusal is not None and refusal.code == "bad_signature"


@pytest.mark.parametrize(
    "missing",
    [TIMESTAMP_HEADER, NONCE_HEADER, KEY_ID_HEADER, CONTENT_SHA256_HEADER, SIGNATURE_HEADER],
)
def test_an_unsigned_request_names_the_missing_header(missing: str) -> None:
    headers = _signed()
    del headers[missing]
    refusal = _verify(Verifier(PSK), headers)
    assert refusal is not None and refusal.code == "missing_signature"
    assert refusal.header == missing


@pytest.mark.parametrize(
    "header, value",
    [
        (TIMESTAMP_HEADER, b"nan"),
        (TIMESTAMP_HEADER, b"-1"),
        (TIMESTAMP_HEADER, b"1e9"),
        (NONCE_HEADER, b"short"),
        (NONCE_HEADER, b"Z" * 32),
        (SIGNATURE_HEADER, b"abc"),
        (KEY_ID_HEADER, b"a key"),
        (CONTENT_SHA256_HEADER, b"abc"),
    ],
)
def test_malformed_headers_are_refused(header: str, value: bytes) -> None:
    headers = _signed()
    headers[header] = value
    refusal = _verify(Verifier(PSK), headers)
    assert refusal is not None and refusal.code == "malformed_signature"


def test_a_replayed_request_is_refused() -> None:
    verifier = Verifier(PSK)
    headers = _signed()
    assert _verify(verifier, headers) is None
    refusal = _verify(verifier, headers, now_s=NOW_S + 1)
    assert refusal is not None and refusal.code == "replayed"


@pytest.mark.parametrize("skew_s", [-31.0, 31.0, 3600.0])
def test_a_timestamp_outside_the_window_is_refused(skew_s: float) -> None:
    refusal = _verify(Verifier(PSK), _signed(now_s=NOW_S + skew_s))
    assert refusal is not None and refusal.code == "stale_timestamp"


@pytest.mark.parametrize("skew_s", [-29.0, 29.0])
def test_a_timestamp_inside_the_window_is_accepted(skew_s: float) -> None:
    assert _verify(Verifier(PSK), _signed(now_s=NOW_S + skew_s)) is None


def test_a_refused_request_does_not_burn_its_nonce() -> None:
    verifier = Verifier(PSK)
    good = _signed()
    forged = dict(good, **{SIGNATURE_HEADER: b"0" * 64})
    assert _verify(verifier, forged) is not None
    assert _verify(verifier, good) is None


def test_nonces_are_forgotten_once_their_timestamp_leaves_the_window() -> None:
    verifier = Verifier(PSK, window_s=30.0)
    for i in range(100):
        assert _verify(verifier, _signed(now_s=NOW_S + i * 0.1), now_s=NOW_S + i * 0.1) is None
    assert verifier.num_nonces == 100
    later = NOW_S + 100.0
    assert _verify(verifier, _signed(now_s=later), now_s=later) is None
    assert verifier.num_nonces == 1


def test_a_full_nonce_table_raises_the_floor_instead_of_forgetting_silently() -> None:
    verifier = Verifier(PSK, max_nonces=4)
    first = _signed(now_s=NOW_S)
    assert _verify(verifier, first) is None
    for i in range(1, 5):
        assert _verify(verifier, _signed(now_s=NOW_S + i), now_s=NOW_S + 4) is None
    assert verifier.num_nonces == 4
    assert verifier.floor_s == NOW_S
    # The first nonce was forgotten, but its replay is still refused (at or below the floor)...
    refusal = _verify(verifier, first, now_s=NOW_S + 4)
    assert refusal is not None and refusal.code == "replayed"
    # ...and so is any fresh request claiming an old timestamp; newer ones pass.
    assert _verify(verifier, _signed(now_s=NOW_S - 1), now_s=NOW_S + 4) is not None
    assert _verify(verifier, _signed(now_s=NOW_S + 5), now_s=NOW_S + 5) is None
    assert verifier.num_nonces == 4


def test_signed_auth_signs_what_httpx_sends() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:8001/internal/register?x=1", content=BODY)
    flow = SignedAuth(PSK).auth_flow(request)
    signed = next(flow)
    headers = {k.lower(): v.encode() for k, v in signed.headers.items()}
    now = float(headers[TIMESTAMP_HEADER])
    assert _Verifier(PSK).verify(b"POST", TARGET.encode(), headers, BODY, now) is None
    other = _Verifier(b"another-key-0123456789")
    wrong = other.verify(b"POST", TARGET.encode(), headers, BODY, now)
    assert wrong is not None and wrong.code == "unknown_key"


# -- the middleware, in process ---------------------------------------------------------------


def _app(refusals: list[Refusal], max_body_bytes: int = 1 << 20) -> SignatureMiddleware:
    inner = FastAPI()

    @inner.post("/echo")
    async def echo(request: Request) -> dict[str, object]:
        return {"body": (await request.body()).decode(), "query": str(request.url.query)}

    @inner.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return SignatureMiddleware(
        inner,
        _Verifier(PSK),
        exempt=("/health",),
        max_body_bytes=max_body_bytes,
        on_refused=refusals.append,
    )


async def _client(app: SignatureMiddleware, psk: bytes | None) -> httpx.AsyncClient:
    auth = SignedAuth(psk) if psk is not None else None
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://node:8000", auth=auth
    )


@pytest.mark.timeout(30)
async def test_middleware_passes_signed_calls_with_their_body() -> None:
    refusals: list[Refusal] = []
    async with await _client(_app(refusals), PSK) as client:
        r = await client.post("/echo?a=b%20c", json={"x": 1})
    assert r.status_code == 200
    assert json.loads(r.json()["body"]) == {"x": 1}
    assert r.json()["query"] == "a=b%20c"
    assert refusals == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("psk", [None, b"another-key-0123456789"])
async def test_middleware_refuses_unsigned_and_wrongly_signed_calls(psk: bytes | None) -> None:
    refusals: list[Refusal] = []
    app = _app(refusals)
    async with await _client(app, psk) as client:
        r = await client.post("/echo", json={"x": 1})
    async with await _client(app, None) as client:
        health = await client.get("/health")
    assert r.status_code == 401
    error = r.json()["error"]
    assert error["type"] == "authentication_error"
    assert error["code"] == ("missing_signature" if psk is None else "unknown_key")
    assert error["param"].startswith("x-prfaas-")
    assert health.status_code == 200  # exempt
    assert len(refusals) == 1 and app.verifier.num_refused == 1


@pytest.mark.timeout(30)
async def test_middleware_refuses_a_replayed_call() -> None:
    refusals: list[Refusal] = []
    app = _app(refusals)
    sent: list[httpx.Request] = []
    async with await _client(app, PSK) as client:
        client.event_hooks["request"] = [_keep(sent)]
        assert (await client.post("/echo", content=b"once")).status_code == 200
        replay = sent[0]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as raw:
            r = await raw.send(httpx.Request(replay.method, replay.url, headers=replay.headers,
                                             content=b"once"))  # fmt: skip
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "replayed"


@pytest.mark.timeout(30)
async def test_middleware_refuses_an_oversized_body_without_passing_it_on() -> None:
    refusals: list[Refusal] = []
    async with await _client(_app(refusals, max_body_bytes=100), PSK) as client:
        r = await client.post("/echo", content=b"x" * 101)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "body_too_large"


def _keep(sent: list[httpx.Request]):  # type: ignore[no-untyped-def]
    async def hook(request: httpx.Request) -> None:
        sent.append(request)

    return hook
