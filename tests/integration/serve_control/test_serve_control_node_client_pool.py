"""The gateway's ``HttpNodeClient`` under many concurrent requests. Each request holds a decode
stream open until its KV lands, and the KV comes from a prefill call the gateway makes on a second
connection while the stream waits. A connection pool smaller than twice the requests in flight
deadlocks: every connection holds a waiting decode stream and no prefill can be sent. (httpx's
default pool is 100 connections: 160 concurrent requests to ``prfaas up examples/two-site.yaml``
timed out 135 of 160 until the pool was unbounded.)

The node here is a small in-process HTTP server with the node API's two calls: a decode stream
answers ``ready``, then waits for its request's prefill, then sends its last token."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from prfaas.serve.gateway.node_client import HttpNodeClient
from prfaas.serve.node.messages import (
    DecodeCommand,
    DecodeEvent,
    NodeEndpoint,
    PrefillCommand,
    PrefillOutcome,
    SamplingMsg,
)

pytestmark = pytest.mark.timeout(120)

REQUESTS = 160
"""More than half of httpx's default pool (100): the old client deadlocked here."""


def _fake_node() -> FastAPI:
    app = FastAPI()
    prefilled: dict[str, asyncio.Event] = {}

    def event_of(rid: str) -> asyncio.Event:
        return prefilled.setdefault(rid, asyncio.Event())

    @app.post("/nodes/{name}/decode")
    async def decode(name: str, cmd: DecodeCommand) -> StreamingResponse:
        async def lines() -> AsyncIterator[str]:
            yield DecodeEvent(kind="ready").model_dump_json() + "\n"
            await event_of(cmd.request_id).wait()  # the KV "lands" once its prefill ran
            done = DecodeEvent(kind="tokens", token_ids=[7], finish_reason="length")
            yield done.model_dump_json() + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/nodes/{name}/prefill")
    async def prefill(name: str, cmd: PrefillCommand) -> PrefillOutcome:
        event_of(cmd.request_id).set()
        return PrefillOutcome(request_id=cmd.request_id, ok=True, first_token=7)

    return app


@contextlib.asynccontextmanager
async def _serve(app: FastAPI) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield port
    finally:
        server.should_exit = True
        await task
        sock.close()


async def _exchange(client: HttpNodeClient, ep: NodeEndpoint, i: int) -> list[int]:
    """What the dispatcher does for one request: decode stream first, then the prefill."""
    sampling = SamplingMsg(max_new_tokens=1)
    rid = f"r{i}"
    decode = DecodeCommand(request_id=rid, num_prompt_tokens=8, sampling=sampling)
    prefill = PrefillCommand(
        request_id=rid, tokens="", decode_node="d0", decode_host="127.0.0.1",
        decode_transfer_port=1, cross_site=True, sampling=sampling,
    )  # fmt: skip
    async with client.decode(ep, decode) as events:
        ready = await anext(events)
        assert ready.kind == "ready"
        outcome = await client.prefill(ep, prefill)
        assert outcome.ok
        return [t async for event in events for t in event.token_ids]


async def test_many_concurrent_requests_do_not_starve_their_prefills_of_connections() -> None:
    async with _serve(_fake_node()) as port:
        ep = NodeEndpoint(node="d0", site="pd", role="decode", host="127.0.0.1", http_port=port)
        client = HttpNodeClient()
        try:
            async with asyncio.timeout(30):  # the deadlock waits forever
                tokens = await asyncio.gather(*(_exchange(client, ep, i) for i in range(REQUESTS)))
        finally:
            await client.aclose()
    assert tokens == [[7]] * REQUESTS
