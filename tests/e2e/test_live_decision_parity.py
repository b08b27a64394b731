"""Decision parity: a live deployment (emulated ``timed`` nodes, real processes and sockets,
the ``prfaas`` router, prefix reuse, tuning and rebalancing on) logs every policy call
(``gateway.decision_log``); replaying the log through the simulator's policy objects for the same
deployment gives identical decisions, and a log with one decision changed is caught there."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import launched

from prfaas.config import DeploymentConfig
from prfaas.policy.decision_log import Record
from prfaas.scenarios import sim_scenario
from prfaas.serve.gateway.decision_log import read_decision_log
from prfaas.sim.replay import replay_decisions

pytestmark = pytest.mark.timeout(240)


def _deployment(log: Path) -> DeploymentConfig:
    # fmt: off
    raw: dict[str, Any] = {
        "engine": {"kind": "timed", "model": "paper-1t", "time_scale": 0.05,
                   "byte_divisor": 1000, "token_chunk": 64},
        "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 60,
                    "decision_log": str(log)},
        "policy": {"router": "prfaas", "rebalance": True, "tune_min_samples": 8,
                   "control_interval_s": 1.0},
        "heartbeat_interval_s": 0.2,
        "sites": [
            {"name": "prfaas", "kind": "prfaas", "hardware": "h200",
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": "h20",
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "p1", "role": "prefill"},
                       {"name": "d0", "role": "decode"}, {"name": "d1", "role": "decode"}]},
        ],
        "links": [{"src": "prfaas", "dst": "pd", "gbps": 100, "rtt_ms": 10}],
        "psk": "test-key-0123456789abcdef",
    }
    # fmt: on
    return DeploymentConfig.model_validate(raw)


SHARED = [(k * 7) % 250 + 1 for k in range(8704)]
"""A prefix every third request repeats: 17 blocks, reusable up to the checkpoint at 16."""


def _send(url: str, i: int) -> int:
    n = 1000 + (i * 3779) % 60000  # both sides of any t the tuner picks (planned: ~19.6k)
    prompt = [(i * 31 + k) % 250 + 1 for k in range(n)]
    if i % 3 == 0:
        prompt = SHARED + prompt
    body = {"model": "paper-1t", "prompt": prompt, "max_tokens": 32}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code


@pytest.fixture(scope="module")
def logged(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[DeploymentConfig, list[Record]]]:
    work = tmp_path_factory.mktemp("parity")
    d = _deployment(work / "decisions.jsonl")
    with launched(d, work) as live:
        assert _send(live.url, 0) == 200
        time.sleep(1.0)  # a few heartbeats: the nodes' reports carry what their sites store
        with ThreadPoolExecutor(6) as pool:
            futures = []
            for i in range(1, 30):
                futures.append(pool.submit(_send, live.url, i))
                time.sleep(0.02)
            statuses = [f.result() for f in futures]
        assert statuses == [200] * 29
    yield d, read_decision_log(work / "decisions.jsonl")


def test_replaying_the_live_log_through_the_simulators_policies_gives_identical_decisions(
    logged: tuple[DeploymentConfig, list[Record]],
) -> None:
    d, records = logged
    report = replay_decisions(records, sim_scenario(d))
    print(f"replayed {report.counts}")
    assert report.identical, report.mismatches[:3]
    assert report.counts["route"] >= 30 and report.counts["place"] >= 30
    assert report.counts["observe"] >= 30 and report.counts["tick"] > 0
    routes = [r["decision"] for r in records if r["kind"] == "route"]
    assert {r["offloaded"] for r in routes} == {True, False}  # both routes were decided
    cached = [r["request"]["cached_tokens_by_site"] for r in records if r["kind"] == "route"]
    assert any(n > 0 for c in cached for n in c.values()), cached  # the prefix was reused
    actions = [a for r in records if r["kind"] == "tick" for a in r["actions"]]
    print(f"control actions: {actions}")


def test_one_changed_decision_is_the_one_mismatch(
    logged: tuple[DeploymentConfig, list[Record]],
) -> None:
    d, records = logged
    changed = copy.deepcopy(records)
    i = next(i for i, r in enumerate(changed) if r["kind"] == "place" and i > 20)
    changed[i]["node"] = "d1" if changed[i]["node"] == "d0" else "d0"
    j = next(j for j, r in enumerate(changed) if r["kind"] == "route" and j > i)
    flipped = changed[j]["decision"]
    flipped["offloaded"] = not flipped["offloaded"]
    report = replay_decisions(changed, sim_scenario(d))
    assert [(m.index, m.kind) for m in report.mismatches] == [(i, "place"), (j, "route")]
