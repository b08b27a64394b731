"""The gateway's ``HttpNodeClient`` reads a node's decode stream split on ``\\n`` only: an event
whose JSON carries U+0085, U+2028 or U+2029 raw (pydantic writes them unescaped; httpx's
``aiter_lines`` splits on them) arrives whole, from a signed node whose every line carries its
answer MAC, as the node sent it. The node-to-gateway hop carries token ids, so the characters ride
in an event's text (a node's error, as a vLLM node forwards vLLM's): the old reader made it a
"garbled decode event" and failed the attempt as ``rejected``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from prfaas.serve.auth import SignedAuth, Verifier
from prfaas.serve.auth_middleware import SignatureMiddleware
from prfaas.serve.gateway.node_client import HttpNodeClient
from prfaas.serve.listeners import bind, server_for
from prfaas.serve.node.messages import DecodeCommand, DecodeEvent, NodeEndpoint, SamplingMsg

pytestmark = pytest.mark.timeout(60)

PSK = b"node-lines-key-0123456789"
ODD = "vLLM: token text a\u0085b\u2028c\u2029d, then more"
"""Each of the three characters ``str.splitlines`` splits on and JSON lines do not."""


def _events(request_id: str) -> list[DecodeEvent]:
    if request_id == "fails":
        return [DecodeEvent(kind="ready"), DecodeEvent(kind="error", error=ODD)]
    return [
        DecodeEvent(kind="ready", prefix_tokens=3),
        DecodeEvent(kind="tokens", token_ids=[0x2028, 0x85]),
        DecodeEvent(kind="tokens", token_ids=[0x2029], finish_reason="stop"),
    ]


def _fake_node() -> object:
    app = FastAPI()

    @app.post("/nodes/{name}/decode")
    async def decode(name: str, cmd: DecodeCommand) -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            for event in _events(cmd.request_id):
                yield event.model_dump_json().encode() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return SignatureMiddleware(app, Verifier(PSK))  # every line gets its answer MAC


@contextlib.asynccontextmanager
async def _serving(app: object) -> AsyncIterator[int]:
    sock = bind("127.0.0.1", 0)
    server = server_for(app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        await task


async def _decode(client: HttpNodeClient, ep: NodeEndpoint, request_id: str) -> list[DecodeEvent]:
    cmd = DecodeCommand(
        request_id=request_id, num_prompt_tokens=8, sampling=SamplingMsg(max_new_tokens=3)
    )
    async with client.decode(ep, cmd) as events:
        return [event async for event in events]


async def test_odd_line_separators_inside_an_event_do_not_split_it() -> None:
    line = DecodeEvent(kind="error", error=ODD).model_dump_json().encode()
    assert all(c.encode() in line for c in "\u0085\u2028\u2029")  # raw on the wire, not escaped
    async with _serving(_fake_node()) as port:
        ep = NodeEndpoint(node="d0", site="pd", role="decode", host="127.0.0.1", http_port=port)
        client = HttpNodeClient(SignedAuth(PSK))
        try:
            failed = await _decode(client, ep, "fails")
            served = await _decode(client, ep, "served")
        finally:
            await client.aclose()
    assert failed == _events("fails")  # the error's text whole, not a "garbled decode event"
    assert failed[-1].error == ODD
    assert served == _events("served")
