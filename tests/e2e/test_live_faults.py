"""Faults on a live deployment, counted: the PrfaaS prefill process killed while it streams KV
(every affected request completes through local prefill), and the PrfaaS site cut off for a few
seconds (no request hangs past its deadline; offloading stops and resumes)."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from live_helpers import launched, routes, timed_deployment

pytestmark = pytest.mark.timeout(240)


def long_prompt(tag: str) -> str:
    """60,000 tokens, offloaded (t = 8192), sharing no prefix block with another tag's prompt."""
    return (tag + "|") * (60_000 // (len(tag) + 1))


def _complete(url: str, prompt: str, max_tokens: int = 32, timeout_s: float = 60) -> dict:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "paper-1t", "prompt": prompt, "max_tokens": max_tokens},
        timeout=timeout_s,
    )
    return {"status": r.status_code, "body": r.json()}


def test_prfaas_killed_mid_stream_falls_back_to_local_prefill(tmp_path: Path) -> None:
    with launched(timed_deployment(time_scale=0.2), tmp_path) as live:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(_complete, live.url, long_prompt(f"k{i}")) for i in range(4)]
            time.sleep(0.4)  # the first prefill is streaming its layers, the rest are queued
            live.kill("prfaas")
            results = [f.result() for f in futures]
        assert [r["status"] for r in results] == [200] * 4, results
        assert all(r["body"]["usage"]["completion_tokens"] == 32 for r in results)
        done = routes(live)
        assert len(done) == 4
        retried = [r for r in done if r["attempts"] == 2]
        assert retried, done  # at least the request being streamed was lost and redone
        assert all(r["prefill_site"] == "pd" for r in retried)
        # the dead node is out of rotation: the next long request is prefilled locally
        after = _complete(live.url, long_prompt("after"))
        assert after["status"] == 200
        assert routes(live)[-1]["prefill_site"] == "pd"


def test_prfaas_site_cut_off_then_back(tmp_path: Path) -> None:
    with launched(timed_deployment(), tmp_path) as live:
        assert _complete(live.url, long_prompt("before"))["status"] == 200
        assert routes(live)[-1]["offloaded"]
        pid = live.child("prfaas").proc.pid
        os.killpg(pid, signal.SIGSTOP)  # the site goes silent: no heartbeats, no KV
        try:
            time.sleep(2.0)  # past heartbeat_timeout_s (1.5 s): out of rotation
            t0 = time.monotonic()
            during = _complete(live.url, long_prompt("during"))
            assert during["status"] == 200 and time.monotonic() - t0 < 30
            assert not routes(live)[-1]["offloaded"]  # offloading stopped
        finally:
            os.killpg(pid, signal.SIGCONT)
        live.wait_nodes(20, ["pf0"])  # it re-registers
        assert _complete(live.url, long_prompt("after"))["status"] == 200
        assert routes(live)[-1]["offloaded"]  # offloading resumed
