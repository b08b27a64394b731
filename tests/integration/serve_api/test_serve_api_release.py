"""Every request path gives back what it holds: after each one, the admission queue has nothing in
flight or queued and the fake backend has no generator left open (its ``finally`` ran).

Paths: streaming, non-streaming, chat, the client gone while queued / before / after the first
token, the deadline, a backend error before and after the first token, a 429. The first test is
the outage this guards against: non-streaming answers used to keep their slot, so after
``max_in_flight`` of them every request got 429.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from serve_api_fakes import MODEL, Server, serve

from prfaas.serve.api import GatewayHTTPConfig

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """Two slots, one queue place, a 2 s deadline."""
    yield from serve(
        GatewayHTTPConfig(max_in_flight=2, max_queued=1, queue_timeout_s=5.0, request_timeout_s=2.0)
    )


def body(prompt: str, *, stream: bool, max_tokens: int = 4, chat: bool = False) -> dict[str, Any]:
    if chat:
        messages = [{"role": "user", "content": prompt}]
        return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream}
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}


def path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


def assert_idle(server: Server) -> None:
    assert server.wait_idle() == (0, 0, 0), "(in flight, queued, open generators)"


def test_many_non_streaming_requests_never_exhaust_the_slots(server: Server) -> None:
    for i in range(12):  # six times max_in_flight, one after another
        resp = httpx.post(server.url + "/v1/completions", json=body(f"n{i}", stream=False))
        assert resp.status_code == 200, resp.text
    assert_idle(server)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_completed_request_releases(server: Server, stream: bool, chat: bool) -> None:
    resp = httpx.post(server.url + path(chat), json=body("done", stream=stream, chat=chat))
    assert resp.status_code == 200
    if stream:
        assert resp.text.endswith("data: [DONE]\n\n")
    assert_idle(server)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_client_gone_before_first_token_releases(server: Server, stream: bool, chat: bool) -> None:
    cancelled = len(server.backend.cancelled)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + path(chat), json=body("[hang]", stream=stream, chat=chat), timeout=0.3
        )
    assert_idle(server)
    assert len(server.backend.cancelled) == cancelled + 1


@pytest.mark.parametrize("chat", [False, True])
def test_client_gone_mid_stream_releases(server: Server, chat: bool) -> None:
    req = body("[slow]", stream=True, max_tokens=200, chat=chat)
    with httpx.stream("POST", server.url + path(chat), json=req, timeout=10) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert server.idle()[2] == 1  # the generator is open while we read
    assert_idle(server)


def test_client_gone_while_a_non_streaming_answer_is_collected(server: Server) -> None:
    cancelled = len(server.backend.cancelled)
    with pytest.raises(httpx.ReadTimeout):  # gone after a few of 100 slow tokens
        httpx.post(
            server.url + "/v1/completions",
            json=body("[slow]", stream=False, max_tokens=100),
            timeout=0.3,
        )
    assert_idle(server)
    assert len(server.backend.cancelled) == cancelled + 1


@pytest.mark.parametrize("stream", [False, True])
def test_deadline_releases(server: Server, stream: bool) -> None:
    resp = httpx.post(
        server.url + "/v1/completions", json=body("[hang]", stream=stream), timeout=10
    )
    assert resp.status_code == 504
    assert_idle(server)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("marker", ["[503]", "[boom]", "[gerr]"])
def test_backend_error_releases(server: Server, stream: bool, marker: str) -> None:
    resp = httpx.post(
        server.url + "/v1/completions", json=body(marker, stream=stream, max_tokens=8), timeout=10
    )
    if stream and marker != "[503]":  # failed after two tokens: an error event ends the stream
        assert resp.status_code == 200
        events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
        assert "error" in json.loads(events[-2]) and events[-1] == "[DONE]"
    else:
        assert resp.status_code in (500, 503)
    assert_idle(server)


async def test_rejected_and_queued_clients_release(server: Server) -> None:
    """Two streams hold both slots; a third waits in the only queue place and leaves; a fourth
    is refused (429). Then the holders finish: nothing is left."""
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        slow = body("[slow]", stream=True, max_tokens=30)
        async with (
            client.stream("POST", "/v1/completions", json=slow) as a,
            client.stream("POST", "/v1/completions", json=slow) as b,
        ):
            assert a.status_code == b.status_code == 200  # both admitted (first token seen)
            queued = asyncio.create_task(client.post("/v1/completions", json=slow, timeout=0.5))
            for _ in range(200):
                if server.idle()[1] == 1:
                    break
                await asyncio.sleep(0.01)
            assert server.idle()[:2] == (2, 1)
            refused = await client.post("/v1/completions", json=slow)
            assert refused.status_code == 429
            with pytest.raises(httpx.ReadTimeout):
                await queued
            assert [line async for line in a.aiter_lines()][-2] == "data: [DONE]"
            assert [line async for line in b.aiter_lines()][-2] == "data: [DONE]"
    assert_idle(server)
