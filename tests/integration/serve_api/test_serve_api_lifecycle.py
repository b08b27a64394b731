"""Overload (429 + Retry-After before the backend is touched), client disconnects cancelling the
backend at every stage, and the metrics endpoint."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_api_fakes import MODEL, Server

pytestmark = pytest.mark.timeout(30)

GIVE_UP = httpx.Timeout(10.0, read=0.3)
"""A client that connects (however slowly a loaded machine accepts) and gives up waiting for the
answer: only the read times out (a connect timeout under load failed these tests once)."""


async def wait_for(predicate_coro, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await predicate_coro():
            return True
        await asyncio.sleep(0.02)
    return False


def metric(server: Server, name: str, **labels: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def slow_body(max_tokens: int) -> dict[str, object]:
    return {"model": MODEL, "prompt": "[slow]", "max_tokens": max_tokens, "stream": True}


async def first_data(lines: AsyncIterator[str]) -> dict[str, object]:
    """The first SSE data object, leaving ``lines`` open (breaking out of ``aiter_lines`` would
    close the response, i.e. disconnect)."""
    async for line in lines:
        if line.startswith("data: "):
            return json.loads(line[6:])  # type: ignore[no-any-return]
    raise AssertionError("stream ended before any data")


async def drain(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]


async def test_full_queue_gets_429_with_retry_after(tiny_server: Server) -> None:
    async with httpx.AsyncClient(base_url=tiny_server.url, timeout=10) as client:

        async def queued() -> bool:
            return (await client.get("/health")).json()["queued"] == 1

        async with client.stream("POST", "/v1/completions", json=slow_body(30)) as a:
            a_lines = a.aiter_lines()
            await first_data(a_lines)  # a holds the only slot
            b_task = asyncio.create_task(client.post("/v1/completions", json=slow_body(3)))
            assert await wait_for(queued)  # b waits in the only queue place
            started = len(tiny_server.backend.started)
            c = await client.post("/v1/completions", json=slow_body(3))
            assert c.status_code == 429
            assert c.headers["retry-after"] == "3"
            assert c.json()["error"]["type"] == "rate_limit_error"
            assert c.json()["error"]["code"] == "rate_limit_exceeded"
            assert len(tiny_server.backend.started) == started  # refused before the backend
            assert (await drain(a_lines))[-2] == "data: [DONE]"
        b = await b_task  # admitted once a finished
        assert b.status_code == 200 and b.text.endswith("data: [DONE]\n\n")
    assert metric(tiny_server, "prfaas_rejected_total", reason="queue_full") >= 1


async def test_client_leaving_the_queue_frees_its_place(tiny_server: Server) -> None:
    before = metric(tiny_server, "prfaas_cancelled_total", stage="queued")
    async with (
        httpx.AsyncClient(base_url=tiny_server.url, timeout=10) as client,
        client.stream("POST", "/v1/completions", json=slow_body(30)) as a,
    ):
        a_lines = a.aiter_lines()
        await first_data(a_lines)
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/completions", json=slow_body(3), timeout=GIVE_UP)

        async def empty_queue() -> bool:
            return (await client.get("/health")).json()["queued"] == 0

        assert await wait_for(empty_queue)
        await drain(a_lines)
    assert metric(tiny_server, "prfaas_cancelled_total", stage="queued") == before + 1


async def test_disconnect_mid_stream_cancels_backend(server: Server) -> None:
    gone = metric(server, "prfaas_cancelled_total", stage="streaming")
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
        client.stream("POST", "/v1/completions", json=slow_body(200)) as resp,
    ):
        request_id = (await first_data(resp.aiter_lines()))["id"]
    # leaving the block closes the connection after one token of 200

    async def cancelled() -> bool:
        return request_id in server.backend.cancelled

    assert await wait_for(cancelled)
    assert request_id not in server.backend.completed
    # Counted as the client leaving (499), not as the 2 s deadline (504).
    assert metric(server, "prfaas_cancelled_total", stage="streaming") == gone + 1


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_before_first_token_cancels_backend(server: Server, stream: bool) -> None:
    gone = metric(server, "prfaas_requests_total", status="499")
    cancelled = len(server.backend.cancelled)
    body = {"model": MODEL, "prompt": "[hang]", "max_tokens": 4, "stream": stream}
    async with httpx.AsyncClient(base_url=server.url, timeout=GIVE_UP) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/completions", json=body)

    async def recorded() -> bool:
        return len(server.backend.cancelled) > cancelled

    assert await wait_for(recorded)
    # 499 (client gone), not 504: the gateway noticed the client before the 2 s deadline.
    assert await wait_for(
        lambda: asyncio.sleep(0, metric(server, "prfaas_requests_total", status="499") == gone + 1)
    )
    stage = "waiting_first_token"
    assert metric(server, "prfaas_cancelled_total", stage=stage) >= 1


def test_metrics_expose_latency_histograms(server: Server) -> None:
    ttft = metric(server, "prfaas_ttft_seconds_count")
    itl = metric(server, "prfaas_inter_token_seconds_count")
    ok = metric(server, "prfaas_requests_total", endpoint="completions", status="200")
    for prompt in ("one", "two", "three"):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "stream": prompt != "two"}
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=10).status_code == 200
    assert metric(server, "prfaas_ttft_seconds_count") == ttft + 3
    assert metric(server, "prfaas_inter_token_seconds_count") == itl + 3 * 4
    assert metric(server, "prfaas_requests_total", endpoint="completions", status="200") == ok + 3
    text = httpx.get(server.url + "/metrics", timeout=5).text
    for name in (
        "prfaas_ttft_seconds_bucket",
        "prfaas_time_per_output_token_seconds_bucket",
        "prfaas_request_latency_seconds_bucket",
        "prfaas_in_flight_requests",
        "prfaas_queued_requests",
        "# TYPE prfaas_route_decisions_total counter",
        "# TYPE prfaas_cross_site_bytes_total counter",
        "# TYPE prfaas_link_utilisation gauge",
        "# TYPE prfaas_prefix_hit_rate gauge",
        "# TYPE prfaas_stage_queue_depth gauge",
    ):
        assert name in text, name


def test_lead_metrics_are_usable(server: Server) -> None:
    metrics = server.app.state.gateway.metrics
    metrics.route_decisions.labels(target="prfaas", reason="long").inc()
    metrics.cross_site_bytes.labels(src_site="prfaas", dst_site="pd").inc(1024)
    metrics.observe_prefix_lookup("pd", lookup_tokens=100, hit_tokens=25)
    metrics.stage_queue_depth.labels(stage="prefill", node="p0").set(3)
    assert metric(server, "prfaas_route_decisions_total", target="prfaas") == 1
    assert metric(server, "prfaas_cross_site_bytes_total", dst_site="pd") == 1024
    assert metric(server, "prfaas_prefix_hit_tokens_total", site="pd") == 25
    assert metric(server, "prfaas_stage_queue_depth", stage="prefill", node="p0") == 3
