"""The control plane against an active attacker, in process: forged calls cost no body, bodies have
a deadline, several keys at once and a reload, calls signed before the process started, and
answers MACed per body and per streamed line, bound to the call's nonce (``serve.auth``,
``serve.auth_middleware``, ``serve.answer_auth``, ``serve.keyring``, ``serve.listeners``)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from prfaas.serve.answer_auth import (
    ANSWER_LINES_HEADER,
    ANSWER_MAC_HEADER,
    AnswerNotAuthentic,
    body_mac,
    verify_answer,
)
from prfaas.serve.auth import NONCE_HEADER, Refusal, SignedAuth, Verifier, signed_headers
from prfaas.serve.auth_middleware import SignatureMiddleware
from prfaas.serve.key_reload import install_sighup_reload, reload_keys, ring_from_file
from prfaas.serve.keyring import Keyring, KeyringHolder, key_id_of
from prfaas.serve.listeners import UnverifiedConnections

pytestmark = pytest.mark.timeout(30)

OLD = b"old-key-0123456789abcdef"
NEW = b"new-key-0123456789abcdef"
NOW_S = 1_800_000_000.0


def _headers(psk: bytes, body: bytes, now_s: float = NOW_S, **kw: Any) -> dict[str, bytes]:
    h = signed_headers(psk, "POST", "node:8000", "/echo", body, now_s, **kw)
    return {k: v.encode() for k, v in h.items()} | {"host": b"node:8000"}


# -- verify before reading the body ----------------------------------------------------------------


def _scope(headers: dict[str, bytes], path: str = "/echo") -> dict[str, Any]:
    return {
        "type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
        "query_string": b"", "headers": [(k.encode(), v) for k, v in headers.items()],
        "client": ("10.0.0.9", 4242),
    }  # fmt: skip


class _Wire:
    """An ASGI receive/send pair that counts body reads and keeps what was sent."""

    def __init__(self, chunks: list[bytes], stall: bool = False) -> None:
        self.chunks = chunks
        self.stall = stall
        self.num_reads = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.num_reads += 1
        if self.stall and self.num_reads > 1:
            await asyncio.sleep(3600)
        more = self.num_reads < len(self.chunks)
        return {"type": "http.request", "body": self.chunks[self.num_reads - 1], "more_body": more}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": json.dumps({"n": len(body)}).encode()})


def _middleware(verifier: Verifier, **kw: Any) -> SignatureMiddleware:
    return SignatureMiddleware(_echo, verifier, clock=lambda: NOW_S, **kw)


async def test_a_forged_signature_is_refused_before_a_byte_of_the_body_is_read() -> None:
    body = b"x" * (20 << 20)
    forged = _headers(b"attacker-key-0123456789", body, key_id=key_id_of(OLD))
    forged["content-length"] = str(len(body)).encode()
    wire = _Wire([body[: 1 << 20]] * 20)
    await _middleware(Verifier(OLD, started_at_s=0))(_scope(forged), wire.receive, wire.send)
    assert wire.status == 401
    assert json.loads(wire.sent[1]["body"])["error"]["code"] == "bad_signature"
    assert wire.num_reads == 0  # not one chunk of the 20 MiB
    assert wire.headers[b"connection"] == b"close"  # and the rest is never read either


async def test_a_replay_of_captured_headers_is_refused_before_its_body() -> None:
    verifier = Verifier(OLD, started_at_s=0)
    body = b'{"x": 1}'
    headers = _headers(OLD, body)
    first = _Wire([body])
    await _middleware(verifier)(_scope(headers), first.receive, first.send)
    assert first.status == 200
    again = _Wire([b"y" * 1000] * 50)
    await _middleware(verifier)(_scope(headers), again.receive, again.send)
    assert again.status == 401 and again.num_reads == 0


async def test_a_body_that_does_not_match_its_signed_digest_is_refused() -> None:
    headers = _headers(OLD, b'{"x": 1}')
    wire = _Wire([b'{"x": 2}'])
    await _middleware(Verifier(OLD, started_at_s=0))(_scope(headers), wire.receive, wire.send)
    assert wire.status == 401
    assert json.loads(wire.sent[1]["body"])["error"]["code"] == "body_mismatch"


async def test_a_verified_body_must_arrive_within_its_deadline() -> None:
    headers = _headers(OLD, b"x" * 100)
    wire = _Wire([b"x" * 10, b"x" * 90], stall=True)
    app = _middleware(Verifier(OLD, started_at_s=0), body_timeout_s=0.2)
    await app(_scope(headers), wire.receive, wire.send)
    assert wire.status == 408
    assert json.loads(wire.sent[1]["body"])["error"]["code"] == "body_timeout"


async def test_a_declared_length_over_the_cap_is_refused_unread() -> None:
    headers = _headers(OLD, b"") | {"content-length": b"1000000"}
    wire = _Wire([b"x"] * 10)
    app = _middleware(Verifier(OLD, started_at_s=0), max_body_bytes=1000)
    await app(_scope(headers), wire.receive, wire.send)
    assert wire.status == 413 and wire.num_reads == 0


# -- replay after a restart ------------------------------------------------------------------------


def test_a_call_signed_before_the_process_started_is_refused() -> None:
    started_s = NOW_S - 5.0  # a supervisor restarted it 5 s ago: its nonce memory is empty
    verifier = Verifier(OLD, started_at_s=started_s, start_skew_s=1.0)
    captured = _headers(OLD, b"{}", now_s=started_s - 10.0)  # inside the 30 s window
    refusal = verifier.verify(b"POST", b"/echo", captured, b"{}", NOW_S)
    assert refusal is not None and refusal.code == "signed_before_start"
    # Calls signed since (or within the allowed skew before) the start pass.
    for signed_s in (started_s - 0.5, NOW_S):
        fresh = _headers(OLD, b"{}", signed_s)
        assert verifier.verify(b"POST", b"/echo", fresh, b"{}", NOW_S) is None


# -- the keyring -----------------------------------------------------------------------------------


def test_several_keys_verify_at_once_and_a_reload_rotates_them() -> None:
    holder = KeyringHolder(Keyring.of(OLD, accepted=[NEW]))
    verifier = Verifier(holder, started_at_s=0)
    for psk in (OLD, NEW):
        assert verifier.verify(b"POST", b"/echo", _headers(psk, b"{}"), b"{}", NOW_S) is None
    holder.replace(Keyring.of(NEW))  # step 3 of a rotation: the old key is dropped
    refusal = verifier.verify(b"POST", b"/echo", _headers(OLD, b"{}"), b"{}", NOW_S)
    assert refusal is not None and refusal.code == "unknown_key"
    assert verifier.verify(b"POST", b"/echo", _headers(NEW, b"{}"), b"{}", NOW_S) is None
    # The signing half reads the same holder: it now signs with the new key.
    request = httpx.Request("POST", "http://node:8000/echo", content=b"{}")
    signed = next(SignedAuth(holder).auth_flow(request))
    assert signed.headers["x-prfaas-key-id"] == key_id_of(NEW)


def test_named_keys_and_bad_rings() -> None:
    ring = Keyring({"tenant-a": OLD, "deploy": NEW}, signing_id="deploy")
    assert ring.signing_key == NEW and ring.key("tenant-a") == OLD and ring.key("x") is None
    with pytest.raises(ValueError, match="signing_id"):
        Keyring({"a": OLD}, signing_id="b")
    with pytest.raises(ValueError, match="key id"):
        Keyring({"a b": OLD}, signing_id="a b")
    assert key_id_of(OLD) != key_id_of(NEW) and OLD.hex() not in key_id_of(OLD)


# -- authenticated answers -------------------------------------------------------------------------


def _answer_app() -> FastAPI:
    app = FastAPI()

    @app.post("/outcome")
    async def outcome(request: Request) -> dict[str, object]:
        return {"ok": True, "tokens": [1, 2, 3], "got": len(await request.body())}

    @app.post("/stream")
    async def stream() -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            for i in range(5):
                yield json.dumps({"token": i, "text": "a\u2028b\u0085"}).encode() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return app


def _tamper(transport: httpx.AsyncBaseTransport, edit: Any) -> httpx.AsyncBaseTransport:
    """A man in the middle: rewrites each answer's bytes with ``edit``."""

    class MITM(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            r = await transport.handle_async_request(request)
            raw = b"".join([c async for c in r.stream])  # type: ignore[union-attr]
            headers, raw = edit(dict(r.headers), raw)
            headers.pop("content-length", None)
            return httpx.Response(r.status_code, headers=headers, stream=_Bytes(raw))

    return MITM()


class _Bytes(httpx.AsyncByteStream):
    """Streamed (``content=`` would be read before the client's auth flow sees the response)."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._raw


def _client(edit: Any = None) -> httpx.AsyncClient:
    app = SignatureMiddleware(_answer_app(), Verifier(OLD))
    transport: httpx.AsyncBaseTransport = httpx.ASGITransport(app=app)
    if edit is not None:
        transport = _tamper(transport, edit)
    return httpx.AsyncClient(transport=transport, base_url="http://node:8000",
                             auth=SignedAuth(OLD))  # fmt: skip


async def test_answers_carry_macs_and_verify() -> None:
    async with _client() as c:
        r = await c.post("/outcome", content=b"abc")
        assert r.status_code == 200 and r.json()["got"] == 3
        assert ANSWER_MAC_HEADER in r.headers
        async with c.stream("POST", "/stream") as s:
            assert s.headers[ANSWER_LINES_HEADER] == "1"
            lines = [json.loads(x) async for x in s.aiter_lines() if x]
    assert [x["token"] for x in lines] == [0, 1, 2, 3, 4]


async def test_a_forged_outcome_is_rejected() -> None:
    def forge(h: dict[str, str], raw: bytes) -> tuple[dict[str, str], bytes]:
        return h, raw.replace(b'"ok":true', b'"ok":false')

    async with _client(forge) as c:
        with pytest.raises(AnswerNotAuthentic, match="does not match"):
            await c.post("/outcome", content=b"abc")


async def test_an_answer_without_a_mac_is_rejected_unless_it_is_an_error() -> None:
    def strip(h: dict[str, str], raw: bytes) -> tuple[dict[str, str], bytes]:
        return {k: v for k, v in h.items() if k != ANSWER_MAC_HEADER}, raw

    async with _client(strip) as c:
        with pytest.raises(AnswerNotAuthentic, match="carries no"):
            await c.post("/outcome", content=b"abc")
    request = httpx.Request("POST", "http://node:8000/outcome")
    error = httpx.Response(503, content=b"busy", request=request)
    verify_answer(error, OLD, b"0" * 32)  # an error can only fail the call: passed through
    assert error.status_code == 503


@pytest.mark.parametrize(
    "edit",
    [
        lambda raw: raw.replace(b'"token": 3', b'"token": 9'),  # a forged token
        lambda raw: b"\n".join(raw.split(b"\n")[:2] + raw.split(b"\n")[3:]),  # a line dropped
        lambda raw: b"\n".join([raw.split(b"\n")[1], raw.split(b"\n")[0], *raw.split(b"\n")[2:]]),
        lambda raw: raw[:-5],  # cut inside a line
    ],
)
async def test_a_tampered_token_stream_is_rejected(edit: Any) -> None:
    async with _client(lambda h, raw: (h, edit(raw))) as c:
        with pytest.raises(AnswerNotAuthentic):
            async with c.stream("POST", "/stream") as s:
                async for _ in s.aiter_lines():
                    pass


async def test_an_answer_cannot_be_replayed_onto_another_call() -> None:
    """A recorded answer (MAC bound to its call's nonce) served for a later call is refused."""
    recorded: dict[str, Any] = {}

    def record_or_replay(h: dict[str, str], raw: bytes) -> tuple[dict[str, str], bytes]:
        if not recorded:
            recorded.update(h=h, raw=raw)
            return h, raw
        return recorded["h"], recorded["raw"]

    async with _client(record_or_replay) as c:
        assert (await c.post("/outcome", content=b"abc")).status_code == 200
        with pytest.raises(AnswerNotAuthentic, match="does not match"):
            await c.post("/outcome", content=b"abc")


def test_body_mac_binds_status_nonce_and_body() -> None:
    base = body_mac(OLD, b"a" * 32, 200, b"{}")
    assert base != body_mac(OLD, b"b" * 32, 200, b"{}")
    assert base != body_mac(OLD, b"a" * 32, 201, b"{}")
    assert base != body_mac(OLD, b"a" * 32, 200, b"{ }")
    assert base != body_mac(NEW, b"a" * 32, 200, b"{}")
    assert len(base) == 2 * hashlib.sha256().digest_size
    assert NONCE_HEADER == "x-prfaas-nonce"


# -- the quota of unverified connections -----------------------------------------------------------


class _Conn:
    def __init__(self, name: str) -> None:
        self.client = name
        self.closed = False
        self.transport = self

    def close(self) -> None:
        self.closed = True


def test_the_oldest_unverified_connection_is_cut_for_a_new_one() -> None:
    quota = UnverifiedConnections(max_unverified=3, ports=[8001])
    assert quota.guards(8001) and not quota.guards(8000)
    conns = [_Conn(f"c{i}") for i in range(5)]
    for c in conns[:3]:
        quota.admit(c)  # type: ignore[arg-type]
    quota.release(conns[1])  # type: ignore[arg-type]  # it made a verified call: out of the quota
    quota.admit(conns[3])  # type: ignore[arg-type]
    assert not any(c.closed for c in conns)
    quota.admit(conns[4])  # type: ignore[arg-type]
    assert conns[0].closed and not conns[1].closed and not conns[3].closed
    assert len(quota) == 3 and quota.num_cut == 1
    assert Refusal("x", "y").header == "x-prfaas-signature"


def test_a_reload_reads_the_files_keys_and_a_bad_file_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    raw = {"sites": [{"name": "pd", "kind": "pd", "nodes": [{"name": "d0", "role": "decode"}]}]}
    path.write_text(yaml.safe_dump(raw | {"psk": OLD.decode()}))
    holder = KeyringHolder(ring_from_file(path))
    path.write_text(yaml.safe_dump(raw | {"psk": NEW.decode(), "accept_psks": [OLD.decode()]}))
    assert reload_keys(holder, lambda: ring_from_file(path))
    assert holder.ring.signing_key == NEW and holder.ring.key(key_id_of(OLD)) == OLD
    path.write_text("psk: [not, a, key")
    assert not reload_keys(holder, lambda: ring_from_file(path))
    assert holder.ring.signing_key == NEW and holder.num_reloads == 1


async def test_sighup_reloads_the_keyring_from_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    raw = {"sites": [{"name": "pd", "kind": "pd", "nodes": [{"name": "d0", "role": "decode"}]}]}
    path.write_text(yaml.safe_dump(raw | {"psk": OLD.decode()}))
    holder = KeyringHolder(ring_from_file(path))
    install_sighup_reload(holder, path)
    try:
        path.write_text(yaml.safe_dump(raw | {"psk": NEW.decode()}))
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(200):  # the handler runs on the loop: give it turns
            if holder.num_reloads:
                break
            await asyncio.sleep(0.01)
        assert holder.ring.signing_key == NEW and holder.ring.key(key_id_of(OLD)) is None
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)


def test_a_nodes_quota_holds_every_connection_its_gateway_opens_at_once(tmp_path: Path) -> None:
    """A burst reaches a busy node as new connections before it has read one head: the node's
    quota leaves room for all its gateway may open (2 per request in flight) beside the flood
    margin (the bare 64 cut 128 of a gateway's connections under 180 requests at once)."""
    from prfaas.config import load_deployment
    from prfaas.serve.listeners import MAX_UNVERIFIED
    from prfaas.serve.run import node_connection_quota

    path = tmp_path / "d.yaml"
    raw = {"sites": [{"name": "pd", "kind": "pd", "nodes": [{"name": "d0", "role": "decode"}]}],
           "gateway": {"max_inflight": 180}}  # fmt: skip
    path.write_text(yaml.safe_dump(raw))
    quota = UnverifiedConnections(node_connection_quota(load_deployment(path)))
    conns = [_Conn(f"c{i}") for i in range(2 * 180)]
    for c in conns:
        quota.admit(c)  # type: ignore[arg-type]
    assert not any(c.closed for c in conns) and quota.num_cut == 0
    flood = [_Conn(f"f{i}") for i in range(MAX_UNVERIFIED + 1)]
    for c in flood:
        quota.admit(c)  # type: ignore[arg-type]
    assert quota.num_cut == 1 and conns[0].closed  # a flood beyond it still cuts the oldest
