"""``ElasticLoop.look`` against a fake launcher (no processes): long prompts routed in a burst
make it add nodes through the local provider; once they have started and the quiet has lasted,
it drains and removes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from prfaas.config import DeploymentConfig
from prfaas.serve.elastic import loop as loop_module
from prfaas.serve.elastic.loop import ElasticLoop

pytestmark = pytest.mark.timeout(30)

DEPLOYMENT = DeploymentConfig.model_validate(
    {
        "engine": {"kind": "timed", "model": "paper-1t"},
        "policy": {"router": "threshold", "threshold_tokens": 8192},
        "sites": [
            {"name": "prfaas", "kind": "prfaas", "hardware": "h200",
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": "h20",
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]},
        ],
        "links": [{"src": "prfaas", "dst": "pd", "gbps": 100}],
        "psk": "unit-test-key-0123456789",
        "autoscale": {"min_nodes": 1, "max_nodes": 3, "tick_s": 1, "rate_window_s": 5,
                      "up_cooldown_s": 0,
                      "down_cooldown_s": 0, "down_stabilisation_s": 0,
                      "prior_tokens_per_s": 10_000, "groups": [{"name": "od", "startup_s": 5}]},
    }
)  # fmt: skip


@dataclass
class Control:
    reports: list[dict[str, Any]] = field(default_factory=list)

    def report_autoscale(self, report: dict[str, Any]) -> None:
        from prfaas.serve.gateway.autoscale_board import AutoscaleReport

        AutoscaleReport.model_validate(report)  # what the gateway would accept
        self.reports.append(report)

    def drain(self, node: str) -> dict[str, Any]:
        return {}

    def resume(self, node: str) -> dict[str, Any]:
        return {}


@dataclass
class FakeLauncher:
    deployment: DeploymentConfig = DEPLOYMENT
    control: Control = field(default_factory=Control)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    route_log: list[dict[str, Any]] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    graces: list[float | None] = field(default_factory=list)

    def add_node(self, site: str, name: str) -> None:
        self.added.append(name)
        self.rows[name] = {"node": name, "site": site, "role": "prefill", "in_rotation": True,
                           "queue_depth": 0, "in_flight": 0}  # fmt: skip

    def remove(self, name: str, grace_s: float | None = None) -> None:
        self.removed.append(name)
        self.graces.append(grace_s)
        self.rows.pop(name, None)

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.rows.values())

    def routes(self) -> list[dict[str, Any]]:
        return list(self.route_log)


def test_a_burst_adds_nodes_and_the_quiet_after_it_removes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(loop_module.time, "monotonic", lambda: now[0])
    launcher = FakeLauncher()
    launcher.rows["pf0"] = {"node": "pf0", "site": "prfaas", "role": "prefill",
                            "in_rotation": True, "queue_depth": 0, "in_flight": 0}  # fmt: skip
    loop = ElasticLoop(launcher)
    loop.look()
    for step in range(1, 6):  # 5 s of burst: 4 long prompts (20k tokens) per second
        now[0] = float(step)
        launcher.route_log += [
            {"request_id": f"r{step}-{i}", "num_prompt_tokens": 20_000, "num_cached_tokens": 0}
            for i in range(4)
        ]
        loop.look()
    assert launcher.added  # 80k tokens/s against 10k per node: more nodes asked for
    assert loop.controller.last is not None and loop.controller.last.reason
    for step in range(6, 40):  # quiet: nothing routed
        now[0] = float(step)
        loop.look()
    assert sorted(launcher.removed) == sorted(launcher.added)
    assert not loop.provider.nodes()
    assert loop.controller.counts.added == len(launcher.added) >= 2
    # every look's decision went to the gateway (its /metrics and `prfaas status`)
    reports = launcher.control.reports
    assert len(reports) == 40 and {r["group"] for r in reports} == {"pool"}
    codes = {(r["action"], r["code"]) for r in reports}
    assert ("add", "load_up") in codes and ("drain", "load_down") in codes


SPOT = DeploymentConfig.model_validate(
    {
        **DEPLOYMENT.model_dump(exclude={"autoscale"}),
        "autoscale": {**DEPLOYMENT.model_dump()["autoscale"], "max_nodes": 6, "groups": [
            {"name": "spot", "spot": True, "usd_per_hour": 3, "notice_s": 2, "startup_s": 1,
             "preemption": {"trace": "1 0", "interval_s": 10}},
            {"name": "od", "startup_s": 1},
        ]},
    }
)  # fmt: skip


def test_a_replayed_spot_trace_preempts_the_spot_nodes_and_adds_fall_back_on_demand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(loop_module.time, "monotonic", lambda: now[0])
    launcher = FakeLauncher(deployment=SPOT)
    launcher.rows["pf0"] = {"node": "pf0", "site": "prfaas", "role": "prefill",
                            "in_rotation": True, "queue_depth": 0, "in_flight": 0}  # fmt: skip
    loop = ElasticLoop(launcher)
    for step in range(20):  # a steady 80k tokens/s against 10k per node, for 20 s
        now[0] = float(step)
        launcher.route_log += [
            {"request_id": f"r{step}-{i}", "num_prompt_tokens": 20_000, "num_cached_tokens": 0}
            for i in range(4)
        ]
        loop.look()
        for t in list(loop.provider._reclaims.values()):
            t.join(5)  # the fake launcher's remove returns at once
        if step == 9:  # the trace's first interval: spot available, so adds go there
            spot = [n for n in launcher.added if "-spot-" in n]
            assert spot and not [n for n in launcher.added if "-od-" in n]
            assert loop.num_preempted == 0
    # From 10 s the trace says 0: every spot node got its notice and was reclaimed (removed
    # with the group's notice and a margin), and the lost capacity came back on demand.
    assert loop.num_preempted == len(spot) and set(spot) <= set(launcher.removed)
    assert {g for n, g in zip(launcher.removed, launcher.graces, strict=True) if n in spot} == {3.0}
    assert [n for n in launcher.added if "-od-" in n]
    assert not [n.name for n in loop.provider.nodes() if n.group == "spot"]
    assert loop.controller.counts.fallbacks > 0
