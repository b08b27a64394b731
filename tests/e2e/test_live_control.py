"""The control plane acting on a live deployment: the rebalancer converts a prefill node to decode
when decode is the bottleneck (the node drains, then switches, and keeps serving), and overload is
refused early with 429 + Retry-After while every accepted request completes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from live_helpers import control as live_control
from live_helpers import launched

from prfaas.config import DeploymentConfig

pytestmark = pytest.mark.timeout(240)


def _deployment() -> DeploymentConfig:
    # Skewed: 4 prefill nodes, 1 decode node, long outputs: decode-bound by far (Eq. 8 off).
    return DeploymentConfig.model_validate(
        {
            "engine": {"kind": "timed", "model": "paper-1t", "time_scale": 0.02,
                       "byte_divisor": 1000, "token_chunk": 256},
            "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 120, "max_inflight": 24,
                        "max_queued": 4},
            "policy": {"router": "local_only", "rebalance": True, "tune_min_samples": 20,
                       "control_interval_s": 1.0},
            "heartbeat_interval_s": 0.1,
            "sites": [
                {"name": "pd", "kind": "pd", "hardware": "h20",
                 "nodes": [{"name": f"p{i}", "role": "prefill"} for i in range(4)]
                 + [{"name": "d0", "role": "decode"}]},
            ],
            "psk": "test-key-0123456789abcdef",
        }
    )  # fmt: skip


def _send(url: str, i: int) -> httpx.Response:
    prompt = [(i * 17 + k) % 200 + 1 for k in range(2000 + 97 * i)]
    body = {"model": "paper-1t", "prompt": prompt, "max_tokens": 1024}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def test_rebalancer_converts_prefill_to_decode_and_overload_gets_429(tmp_path: Path) -> None:
    with launched(_deployment(), tmp_path) as live:
        # All 60 leave together (a barrier, one thread each): sent one by one, a loaded host
        # spread them so thinly that fewer than max_inflight + max_queued were ever in flight
        # (seen with the unit tier running beside this one), and nothing was refused.
        start = threading.Barrier(60)

        def send(i: int) -> httpx.Response:
            start.wait(timeout=60)
            return _send(live.url, i)

        with ThreadPoolExecutor(60) as pool:
            responses = list(pool.map(send, range(60)))
        control = live_control(live, "/internal/control")
        roles = {n["node"]: n["role"] for n in live.nodes()}
    statuses = [r.status_code for r in responses]
    odd = [r.text for r in responses if r.status_code not in (200, 429)]
    assert set(statuses) <= {200, 429}, odd
    refused = [r for r in responses if r.status_code == 429]
    assert refused, "a burst beyond max_inflight + max_queued must be refused"
    assert all(r.headers.get("retry-after") for r in refused)
    assert all(r.json()["error"]["type"] for r in refused)
    accepted = [r for r in responses if r.status_code == 200]
    assert all(r.json()["usage"]["completion_tokens"] == 1024 for r in accepted)
    changes = control["role_changes"]
    assert changes and all(c["to"] == "decode" for c in changes), control
    assert sum(1 for role in roles.values() if role == "decode") > 1, roles
