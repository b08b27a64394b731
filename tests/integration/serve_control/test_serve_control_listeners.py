"""``serve.listeners`` over loopback sockets: a request head that arrives too slowly (or never)
gets the connection cut; complete heads, slow bodies and keep-alive reuse are unaffected; one server
on two sockets routes by the local port; behind the signature check, a forged call with a big body
is answered and cut without its body being read, and unverified connections are held to their
quota while verified ones are not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI, Request

from prfaas.serve.auth import SignedAuth, Verifier, signed_headers
from prfaas.serve.auth_middleware import SignatureMiddleware
from prfaas.serve.listeners import (
    HeadTimeoutProtocol,
    PortRouter,
    UnverifiedConnections,
    bind,
    server_for,
)

HEAD_TIMEOUT_S = 0.5
HANG_BOUND_S = 20.0
"""Generous: only a connection that is never cut fails (no timing is asserted)."""

pytestmark = pytest.mark.timeout(60)


def _app(name: str) -> FastAPI:
    app = FastAPI()

    @app.get("/who")
    async def who() -> dict[str, str]:
        return {"app": name}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    return app


@asynccontextmanager
async def _serving(
    app: object, num_sockets: int = 1, unverified: UnverifiedConnections | None = None
) -> AsyncIterator[list[int]]:
    socks = [bind("127.0.0.1", 0) for _ in range(num_sockets)]
    ports = [s.getsockname()[1] for s in socks]
    server = server_for(app, head_timeout_s=HEAD_TIMEOUT_S, unverified=unverified)
    task = asyncio.create_task(server.serve(sockets=socks))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield ports
    finally:
        server.should_exit = True
        await task


async def _closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sent until it closed the connection."""
    async with asyncio.timeout(HANG_BOUND_S):
        return await reader.read()


async def test_half_a_request_line_is_cut() -> None:
    async with _serving(_app("a")) as (port,):
        before = HeadTimeoutProtocol.num_cut
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /who HT")
        await writer.drain()
        assert await _closed_by_server(reader) == b""
        writer.close()
        assert HeadTimeoutProtocol.num_cut == before + 1


async def test_headers_trickling_in_are_cut() -> None:
    async with _serving(_app("a")) as (port,):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /who HTTP/1.1\r\nHost: x\r\n")
        for i in range(100):  # one header line at a time, never the blank line
            if reader.at_eof():
                break
            try:
                writer.write(f"X-Slow-{i}: 1\r\n".encode())
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(HEAD_TIMEOUT_S / 4)
        assert await _closed_by_server(reader) == b""
        writer.close()


async def test_a_silent_connection_is_cut() -> None:
    async with _serving(_app("a")) as (port,):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed_by_server(reader) == b""
        writer.close()


async def test_keep_alive_then_half_a_request_is_cut() -> None:
    async with _serving(_app("a")) as (port,):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /who HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))  # fmt: skip
        assert b'"a"' in await reader.readexactly(length)
        writer.write(b"GET /who HTTP/1.1\r\nHo")  # the next request, never finished
        await writer.drain()
        assert await _closed_by_server(reader) == b""
        writer.close()


async def test_a_slow_body_after_a_complete_head_is_not_cut() -> None:
    async with _serving(_app("a")) as (port,):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
        await writer.drain()
        await asyncio.sleep(HEAD_TIMEOUT_S * 3)
        writer.write(b"67890")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        writer.close()


async def test_one_server_routes_two_sockets_by_local_port() -> None:
    client, control = _app("client"), _app("control")
    # The ports are only known once bound: route through a mutable mapping filled below.
    router = PortRouter(client, {})
    async with _serving(router, num_sockets=2) as (client_port, control_port):
        router.by_port[control_port] = control
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
            a = await http.get(f"http://127.0.0.1:{client_port}/who")
            b = await http.get(f"http://127.0.0.1:{control_port}/who")
    assert a.json() == {"app": "client"}
    assert b.json() == {"app": "control"}


PSK = b"listener-key-0123456789"


async def test_a_forged_call_is_answered_and_cut_before_its_body() -> None:
    got: list[int] = []
    inner = _app("a")

    @inner.post("/count")
    async def count(request: Request) -> dict[str, int]:
        got.append(len(await request.body()))
        return {"n": got[-1]}

    app = SignatureMiddleware(inner, Verifier(PSK))
    async with _serving(app) as (port,):
        host = f"127.0.0.1:{port}"
        size = 20 << 20
        # Well-formed, fresh, the real key's id and the body's digest: a made-up signature.
        forged = signed_headers(PSK, "POST", host, "/count", b"x" * size, time.time())
        forged["x-prfaas-signature"] = "0" * 64
        head = "".join(f"{k}: {v}\r\n" for k, v in forged.items())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"POST /count HTTP/1.1\r\nHost: {host}\r\nContent-Length: {size}\r\n"
                     f"{head}\r\n".encode() + b"x" * 65536)  # fmt: skip
        await writer.drain()
        answer = await _closed_by_server(reader)  # answered, then closed: the rest is never read
        writer.close()
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"bad_signature" in answer and b"connection: close" in answer.lower()
        async with httpx.AsyncClient(auth=SignedAuth(PSK), timeout=5, trust_env=False) as http:
            ok = await http.post(f"http://{host}/count", content=b"abc")
    assert ok.status_code == 200 and got == [3]


async def test_unverified_connections_are_held_to_their_quota() -> None:
    quota = UnverifiedConnections(max_unverified=4)
    app = SignatureMiddleware(_app("a"), Verifier(PSK))
    http = httpx.AsyncClient(auth=SignedAuth(PSK), timeout=5, trust_env=False)
    async with _serving(app, unverified=quota) as (port,), http:
        assert (await http.get(f"http://127.0.0.1:{port}/who")).status_code == 200
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(10)]
        # The six oldest idle ones were cut to make room; the verified keep-alive one was not.
        for reader, _ in idle[:6]:
            assert await _closed_by_server(reader) == b""
        assert quota.num_cut == 6 and len(quota) == 4
        assert (await http.get(f"http://127.0.0.1:{port}/who")).status_code == 200
        for _, writer in idle:
            writer.close()
