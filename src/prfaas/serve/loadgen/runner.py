"""Replays a workload against an endpoint: each request sent at its arrival time (or as soon as one
of ``concurrency`` slots frees up), within an optional wall-clock ``duration_s``.

Structured: one ``TaskGroup`` holds every request; each request carries its own timeout, so the run
always ends. ``on_done`` is called once per finished request (progress display).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from prfaas.serve.loadgen.client import RequestResult, stream_completion
from prfaas.serve.loadgen.workload import BenchRequest, PromptSynth


async def run_workload(
    requests: Sequence[BenchRequest],
    *,
    base_url: str,
    model: str,
    synth: PromptSynth,
    concurrency: int,
    timeout_s: float,
    duration_s: float | None = None,
    on_done: Callable[[RequestResult], None] | None = None,
    extra_body: dict[str, Any] | None = None,
    api_key: str | None = None,
) -> tuple[list[RequestResult], float]:
    """Results in request order, and the wall time of the run in seconds. ``extra_body``: fields
    added to every request (e.g. ``ignore_eos``); ``api_key``: sent as a bearer token."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    url = base_url.rstrip("/") + "/v1/completions"
    slots = asyncio.Semaphore(concurrency)
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers) as client:
        start = time.perf_counter()

        async def one(req: BenchRequest, sent_s: float) -> None:
            try:
                body = {
                    "model": model,
                    "prompt": synth.prompt(req),
                    "max_tokens": req.max_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    **(extra_body or {}),
                }
                result = await stream_completion(
                    client, url=url, body=body, index=req.index,
                    num_prompt_tokens=req.num_prompt_tokens, sent_s=sent_s, timeout_s=timeout_s,
                )  # fmt: skip
            finally:
                slots.release()
            results.append(result)
            if on_done is not None:
                on_done(result)

        async with asyncio.TaskGroup() as tasks:
            for req in requests:
                if duration_s is not None and req.arrival_s >= duration_s:
                    break
                delay_s = start + req.arrival_s - time.perf_counter()
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                if duration_s is not None and time.perf_counter() - start >= duration_s:
                    break  # concurrency kept us past the end: stop sending
                await slots.acquire()
                tasks.create_task(one(req, time.perf_counter() - start))
        wall_s = time.perf_counter() - start
    results.sort(key=lambda r: r.index)
    return results, wall_s
