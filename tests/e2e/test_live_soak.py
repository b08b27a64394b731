"""The soak, short: a live deployment used as its users would (the official ``openai`` client,
completions and chat, streaming and not, 48 concurrent, clients hanging up before and after the
first token, copies of one greedy prompt), with a decode node SIGKILLed midway and brought back by
the launcher's supervisor. Afterwards nothing is held: the gateway has nothing in flight or queued,
every node is back in rotation with no KV in use and no work in flight, and every request either
completed or failed with the reason its client saw. Once with emulated nodes, once with tiny torch
nodes. The long version: ``bench/soak.py``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import launched, timed_deployment

from prfaas.config import DeploymentConfig
from prfaas.serve.launcher import Launcher
from prfaas.serve.loadgen.soak import SoakConfig, SoakResult, run_soak
from prfaas.serve.supervisor import RestartPolicy

pytestmark = pytest.mark.timeout(300)


def settled(live: Launcher, timeout_s: float = 30.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Wait until the gateway and every node are idle and in rotation; returns the last looks."""
    deadline = time.monotonic() + timeout_s
    health: dict[str, Any] = {}
    nodes: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        health = httpx.get(f"{live.url}/health", timeout=5).json()
        nodes = live.nodes()
        idle = health["in_flight"] == 0 and health["queued"] == 0
        if idle and all(
            n["in_rotation"] and n["kv_used_bytes"] == 0 and n["in_flight"] == 0 for n in nodes
        ):
            break
        time.sleep(0.2)
    return health, nodes


def check(result: SoakResult, live: Launcher, num_requests: int, greedy: bool = True) -> None:
    summary = result.summary()
    assert result.sent == num_requests, summary
    assert result.completed + result.hung_up + sum(result.failed.values()) == result.sent
    assert result.unexplained == 0, summary
    assert result.completed >= 0.6 * num_requests, summary
    if greedy:  # the timed engine's tokens are random: only real models have a greedy answer
        assert result.reference_copies > 0 and not result.reference_mismatches, summary
    health, nodes = settled(live)
    assert health["in_flight"] == 0 and health["queued"] == 0, health
    for n in nodes:
        assert n["in_rotation"], n
        assert n["kv_used_bytes"] == 0 and n["in_flight"] == 0, n
    # Still serving after all that.
    r = httpx.post(
        f"{live.url}/v1/completions",
        json={"model": result_model(live), "prompt": "after", "max_tokens": 4},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def result_model(live: Launcher) -> str:
    return live.deployment.engine.model


def kill(live: Launcher, name: str) -> None:
    """SIGKILL the node's process and let the soak go on: the supervisor restarts it, the gateway
    quarantines it meanwhile, and ``check`` waits for it to be back in rotation."""
    live.kill(name)


def test_soak_emulated_nodes(tmp_path: Path) -> None:
    deployment = timed_deployment(time_scale=0.02)
    config = SoakConfig(
        model="paper-1t", num_requests=240, concurrency=48, max_tokens=16, identical_every=0
    )
    with launched(deployment, tmp_path, process_per_node=True, restart=RestartPolicy()) as live:
        result = run_soak(live.url, config, midway=lambda: kill(live, "d0"))
        check(result, live, config.num_requests, greedy=False)
        # the timed engine's passes are sleeps: no engine CPU reported
        assert all(n["engine_cpu_s"] == 0.0 for n in settled(live)[1])


def _torch_deployment(model_dir: Path) -> DeploymentConfig:
    return DeploymentConfig.model_validate(
        {
            "engine": {"kind": "torch", "model": "tiny-qwen3-next", "model_path": str(model_dir),
                       "block_tokens": 64},
            "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 120,
                        "heartbeat_timeout_s": 3},
            "policy": {"router": "threshold", "threshold_tokens": 40},
            "heartbeat_interval_s": 0.3,
            "sites": [
                {"name": "prfaas", "kind": "prfaas", "hardware": "h200",
                 "nodes": [{"name": "pf0", "role": "prefill"}]},
                {"name": "pd", "kind": "pd", "hardware": "h20",
                 "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"},
                           {"name": "d1", "role": "decode"}]},
            ],
            "links": [{"src": "prfaas", "dst": "pd", "gbps": 100}],
            "psk": "test-key-0123456789abcdef",
        }
    )  # fmt: skip


@pytest.mark.behind  # torch models, CPU-bound, nothing timed: the back stream of `make test`
def test_soak_tiny_torch_nodes(tmp_path: Path) -> None:
    from prfaas.engine.torch.tiny import make_tiny

    model_dir = make_tiny("qwen3_next", tmp_path / "model")
    config = SoakConfig(
        model="tiny-qwen3-next", num_requests=64, concurrency=32, max_tokens=8,
        prompt_words=(2, 40),
    )  # fmt: skip
    with launched(_torch_deployment(model_dir), tmp_path / "live", restart=RestartPolicy()) as live:
        result = run_soak(live.url, config, midway=lambda: kill(live, "d1"))
        check(result, live, config.num_requests)
        # each torch node reports its engine thread's CPU in passes (d1 restarted: from then on)
        cpu = {n["node"]: n["engine_cpu_s"] for n in settled(live)[1]}
        assert cpu["pf0"] > 0 and cpu["p0"] > 0 and cpu["d0"] > 0, cpu
