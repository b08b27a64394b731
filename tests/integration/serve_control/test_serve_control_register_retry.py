"""A node started beside its gateway registers as soon as the gateway listens, not a heartbeat
interval later (``serve.node.control_plane``: the launcher starts the gateway and its workers
together); a gateway that answers but refuses is asked again only every interval."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import pytest

from prfaas.serve.node.control_plane import run_control_plane

pytestmark = pytest.mark.timeout(30)
# No auth (None): signatures are the control listener's business; these servers check none.

INTERVAL_S = 60.0
"""Far longer than the test may run: a registration it sees came from the quick retry."""


class _Body:
    def model_dump(self) -> dict[str, Any]:
        return {"node": "n0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _answering(port: int, status: str, seen: list[str]) -> asyncio.Server:
    """A one-line HTTP server: every request gets ``status`` and an empty JSON body."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        length = next(
            (
                int(h.split(":")[1])
                for h in head.split("\r\n")
                if h.lower().startswith("content-length")
            ),
            0,
        )
        await reader.readexactly(length)
        seen.append(head.split(" ")[1])
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}".encode()
        )
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def test_a_gateway_that_comes_up_late_is_registered_with_at_once() -> None:
    port = _free_port()  # nothing listens yet: the node's first tries are refused connections
    registered = asyncio.Event()
    plane = asyncio.create_task(
        run_control_plane(
            f"http://127.0.0.1:{port}", None, INTERVAL_S, logging.getLogger("t"),
            _Body, _Body, on_registered=registered.set,
        )
    )  # fmt: skip
    seen: list[str] = []
    try:
        await asyncio.sleep(0.5)  # a few refused tries
        server = await _answering(port, "200 OK", seen)
        async with server:
            await asyncio.wait_for(registered.wait(), timeout=10)
        assert seen == ["/internal/register"]
    finally:
        plane.cancel()
        await asyncio.gather(plane, return_exceptions=True)


async def test_a_gateway_that_refuses_is_asked_again_only_each_interval() -> None:
    port = _free_port()
    seen: list[str] = []
    server = await _answering(port, "401 Unauthorized", seen)
    async with server:
        plane = asyncio.create_task(
            run_control_plane(
                f"http://127.0.0.1:{port}", None, INTERVAL_S, logging.getLogger("t"),
                _Body, _Body,
            )
        )  # fmt: skip
        try:
            await asyncio.sleep(1.0)  # five quick retries' worth
            assert seen == ["/internal/register"]  # one try, then the interval
        finally:
            plane.cancel()
            await asyncio.gather(plane, return_exceptions=True)
