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

    drained: list[str] = field(default_factory=list)

    def drain(self, node: str) -> dict[str, Any]:
        self.drained.append(node)
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
        if step == 8:  # the trace's first interval: spot available, so adds go there
            spot = [n for n in launcher.added if "-spot-" in n]
            assert spot and not [n for n in launcher.added if "-od-" in n]
            assert loop.num_preempted == 0
        if step == 9:  # 10 s from the loop's start: the trace's 0, at once
            assert loop.num_preempted == len(spot)
    # From 10 s after the loop's start (its first look, at 0, is 1 s in) the trace says 0:
    # every spot node got its notice and was reclaimed (removed with the group's notice and a
    # margin), and the lost capacity came back on demand.
    assert loop.num_preempted == len(spot) and set(spot) <= set(launcher.removed)
    assert {g for n, g in zip(launcher.removed, launcher.graces, strict=True) if n in spot} == {3.0}
    assert [n for n in launcher.added if "-od-" in n]
    assert not [n.name for n in loop.provider.nodes() if n.group == "spot"]
    assert loop.controller.counts.fallbacks > 0


RATE = DeploymentConfig.model_validate(
    {
        **DEPLOYMENT.model_dump(exclude={"autoscale", "workload"}),
        "workload": {"seed": 7},
        "autoscale": {**DEPLOYMENT.model_dump()["autoscale"], "max_nodes": 6, "groups": [
            {"name": "spot", "spot": True, "usd_per_hour": 3, "notice_s": 2, "startup_s": 1,
             "preemption": {"mttp_s": 15}},
            {"name": "od", "startup_s": 1},
        ]},
    }
)  # fmt: skip


def test_a_spot_group_with_mttp_is_preempted_live_at_the_simulators_draws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each spot node gets its notice at the first look at or after its launch plus its draw:
    the simulator's draws (``PreemptionConfig.notice_at_s`` from ``random.Random(seed)``, the
    file's ``workload.seed``), in the order the nodes were added; reclaimed with the group's
    notice, counted, and the lost capacity added again."""
    import math
    import random

    now = [0.0]
    monkeypatch.setattr(loop_module.time, "monotonic", lambda: now[0])
    launcher = FakeLauncher(deployment=RATE)
    launcher.rows["pf0"] = {"node": "pf0", "site": "prfaas", "role": "prefill",
                            "in_rotation": True, "queue_depth": 0, "in_flight": 0}  # fmt: skip
    added_at: dict[str, float] = {}
    removed_at: dict[str, float] = {}
    add, remove = launcher.add_node, launcher.remove

    def add_node(site: str, name: str) -> None:
        added_at[name] = now[0]
        add(site, name)

    def remove_node(name: str, grace_s: float | None = None) -> None:
        removed_at[name] = now[0]
        remove(name, grace_s)

    monkeypatch.setattr(launcher, "add_node", add_node)
    monkeypatch.setattr(launcher, "remove", remove_node)
    loop = ElasticLoop(launcher)
    end_s = 60
    for step in range(end_s + 1):  # a steady 80k tokens/s against 10k per node
        now[0] = float(step)
        launcher.route_log += [
            {"request_id": f"r{step}-{i}", "num_prompt_tokens": 20_000, "num_cached_tokens": 0}
            for i in range(4)
        ]
        loop.look()
        for t in list(loop.provider._reclaims.values()):
            t.join(5)
    spot = [n for n in launcher.added if "-spot-" in n]
    rng = random.Random(7)  # the simulator's generator for this file
    due = {n: RATE.autoscale.groups[0].preemption.build().notice_at_s(rng, added_at[n])
           for n in spot}  # fmt: skip
    noticed = [n for n, g in zip(launcher.removed, launcher.graces, strict=True) if g == 3.0]
    assert sorted(noticed) == sorted(n for n in spot if due[n] <= end_s)  # each one due, no other
    assert len(noticed) >= 3  # mttp 15 s over a minute: a real test of several notices
    for n in noticed:  # at the first look (1 s apart) at or after its drawn time
        assert removed_at[n] == math.ceil(due[n]), (n, due[n], removed_at[n])
    assert loop.num_preempted == loop.observer.num_lost == len(noticed)
    assert not [n for n, g in zip(launcher.removed, launcher.graces, strict=True) if g is None]
    live = [n for n in loop.provider.nodes() if n.group == "spot"]
    assert len(live) >= 1  # the lost capacity came back (spot is always available here)


def test_live_and_simulated_spot_preemptions_are_on_one_clock() -> None:
    """The loop reads every ``autoscale:`` second as a wall second (its own clock, whatever the
    engine's ``time_scale``: the trace test above notices 10 wall seconds after the loop's
    start, at a ``time_scale`` of 0.1); the simulator of a live run restates the file in
    modelled seconds in one place (``in_modelled_seconds``), the trace's interval and the
    rate's mean with the rest. So the same file gives the same instants: the simulated first
    notice at 10 wall seconds (100 modelled), and a rate's draw for a node launched at the same
    instant lands at the same instant."""
    import random

    from prfaas.commands.sim_elastic import elastic_scenario
    from prfaas.sim.elastic import Arrival, ElasticSim, in_modelled_seconds
    from prfaas.sim.elastic.pool import NodeState

    k = SPOT.engine.wall_s_per_modelled_s
    assert k == pytest.approx(0.1)
    live_trace = SPOT.autoscale.groups[0].preemption.build()
    sc = in_modelled_seconds(elastic_scenario(SPOT, "SPOT"), k)
    for i in range(80):  # every half wall second of the trace's two cycles
        assert sc.groups[0].preemption.available(i * 0.5 / k) == live_trace.available(i * 0.5)
    # The simulator on the same steady load (4 x 20k tokens per wall second) notices its spot
    # nodes when the trace turns 0 at 10 wall seconds, as the loop does (the test above).
    arrivals = [Arrival(4 * s + i, s / k, 20_000) for s in range(20) for i in range(4)]
    sim = ElasticSim(sc, iter(arrivals), 20 / k)
    report = sim.run()
    noticed = [n for n in sim.nodes if n.noticed]
    assert report.num_preemptions == len(noticed) > 0
    first_gone_s = min(n.gone_s or 0.0 for n in noticed)  # at the notice, or by its deadline
    notice_s = sc.groups[0].notice_s
    assert 10 / k <= first_gone_s <= 10 / k + notice_s, first_gone_s
    assert all(n.state is NodeState.GONE for n in noticed)
    # The rate: one draw, the same instant on either clock.
    live_rate = RATE.autoscale.groups[0].preemption.build()
    assert RATE.engine.wall_s_per_modelled_s == k
    rate_sc = in_modelled_seconds(elastic_scenario(RATE, "RATE"), k)
    wall_at = live_rate.notice_at_s(random.Random(7), 3.0)
    modelled_at = rate_sc.groups[0].preemption.notice_at_s(random.Random(7), 3.0 / k)
    assert wall_at is not None and modelled_at == pytest.approx(wall_at / k)


def test_a_groups_initial_nodes_start_with_the_loop_and_serve_once_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulator's ``initial_nodes`` are there at 0 (``ready_now``): live, the loop's start
    adds them, and they serve as soon as they registered, without their group's start-up hold
    (a node added later is held for it)."""
    now = [0.0]
    monkeypatch.setattr(loop_module.time, "monotonic", lambda: now[0])
    raw = DEPLOYMENT.model_dump(mode="json", exclude_defaults=True)
    raw["autoscale"]["groups"] = [{"name": "od", "startup_s": 5, "initial_nodes": 2}]
    launcher = FakeLauncher(deployment=DeploymentConfig.model_validate(raw))
    loop = ElasticLoop(launcher)
    loop.start()
    loop.stop()
    assert len(launcher.added) == 2 and not launcher.control.drained
    now[0] = 0.5  # registered (the fake's rows), long before the group's 5 s start-up
    loop.provider.poll()
    assert [n.phase.value for n in loop.provider.nodes()] == ["serving", "serving"]
    later = loop.provider.add("od")  # asked for by the autoscaler: held for its start-up
    loop.provider.poll()
    assert launcher.control.drained == [later]
