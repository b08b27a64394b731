"""The elastic-pool simulator: a burst grows then shrinks the pool with every request served,
starting nodes are charged and serve nothing, spot notices finish or hand back what they hold,
an availability trace falls back to on-demand, bad input names its field, and runs repeat."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prfaas.policy.autoscaler import AutoscaleConfig
from prfaas.sim.elastic import (
    Arrival,
    ElasticScenario,
    ElasticSim,
    GroupConfig,
    PreemptionConfig,
    RateProfile,
    parse_availability,
    warp,
)
from prfaas.sim.scenario import ScenarioError

pytestmark = pytest.mark.timeout(60)
AUTO = AutoscaleConfig(min_nodes=0, max_nodes=8, startup_s=60, up_cooldown_s=10,
                       down_cooldown_s=30, down_stabilisation_s=30,
                       prior_tokens_per_s=13_000)  # fmt: skip


def steady_then_burst(duration_s: float, tokens: int = 20_000) -> list[Arrival]:
    """1 request/s, 6/s from 300 s to 600 s, then quiet from 900 s."""
    out, t, i = [], 0.0, 0
    while t < duration_s:
        rate = 6.0 if 300 <= t < 600 else 1.0 if t < 900 else 0.1
        out.append(Arrival(i, t, tokens))
        i += 1
        t += 1.0 / rate
    return out


def test_a_burst_grows_then_shrinks_the_pool_and_every_request_is_served() -> None:
    sc = ElasticScenario((GroupConfig("od", startup_s=60),), autoscale=AUTO)
    sim = ElasticSim(sc, steady_then_burst(1500), 1500)
    r = sim.run()
    assert r.num_completed == r.num_requests > 0
    adds = [e for e in r.scale_events if e.action == "add"]
    drains = [e for e in r.scale_events if e.action == "drain"]
    assert adds and drains and all(e.reason for e in r.scale_events)
    peak = max(s.num_serving for s in r.samples)
    assert peak >= 3 and r.samples[-1].num_serving < peak
    (g,) = r.groups
    assert g.starting_h > 0 and g.busy_h > 0 and g.usd > 0


def test_starting_nodes_cost_money_and_serve_nothing() -> None:
    """A fixed pool of one node against a pool whose one node starts for 100 s: the second
    is charged those seconds as starting, and serves what arrives after it is ready."""
    arrivals = [Arrival(i, 10.0 * i, 12_000) for i in range(30)]
    auto = replace(AUTO, min_nodes=1, max_nodes=1)
    sc = ElasticScenario((GroupConfig("od", startup_s=100),), autoscale=auto)
    r = ElasticSim(sc, arrivals, 300).run()
    (g,) = r.groups
    assert g.starting_h == pytest.approx(100 / 3600, abs=1e-6)
    assert r.num_completed == 30
    assert r.num_local_for_capacity > 0  # what came while it started went local


def test_a_spot_notice_finishes_some_prefills_and_hands_the_rest_back() -> None:
    """Long prompts (about 5.6 s of prefill each) on 8 spot nodes (and any the autoscaler adds
    before 60 s); at 60 s spot goes away with a 3 s notice: prefills that end in time finish,
    the others go back to the queue and are served by the on-demand fallback."""
    arrivals = [Arrival(i, 0.7 * i, 100_000) for i in range(200)]
    spot = GroupConfig("spot", spot=True, usd_per_hour=10.0, notice_s=3.0, startup_s=5,
                       initial_nodes=8,
                       preemption=PreemptionConfig(trace=(1, 0, 0, 0), interval_s=60))  # fmt: skip
    od = GroupConfig("od", startup_s=5)
    auto = replace(AUTO, min_nodes=1, max_nodes=12)
    sc = ElasticScenario((spot, od), autoscale=auto, ttft_slo_s=30.0)
    r = ElasticSim(sc, arrivals, 200).run()
    assert r.num_preemptions >= 8
    assert r.num_finished_on_notice > 0 and r.num_requeued_on_notice > 0
    assert r.num_completed == r.num_requests == 200  # none lost
    assert r.num_fallbacks > 0
    _, od_h = r.groups
    assert od_h.busy_h > 0  # the re-queued and the rest were served on-demand


def test_preemption_rate_is_seeded_and_runs_repeat() -> None:
    spot = GroupConfig("spot", spot=True, usd_per_hour=10.0, notice_s=30,
                       startup_s=60, preemption=PreemptionConfig(mttp_s=300))  # fmt: skip
    sc = ElasticScenario((spot, GroupConfig("od", startup_s=60)), autoscale=AUTO, seed=3)
    a = ElasticSim(sc, steady_then_burst(1500), 1500).run()
    b = ElasticSim(sc, steady_then_burst(1500), 1500).run()
    assert a.as_dict() == b.as_dict()
    assert a.num_preemptions > 0 and a.num_completed == a.num_requests


@pytest.mark.parametrize(
    ("scenario", "field"),
    [
        (ElasticScenario((GroupConfig("s", spot=True),)), "groups.s.usd_per_hour"),
        (ElasticScenario((GroupConfig("g", startup_s=-1),)), "groups.g.startup_s"),
        (ElasticScenario((GroupConfig("g", preemption=PreemptionConfig(mttp_s=60)),)),
         "groups.g.preemption"),
        (ElasticScenario(()), "groups"),
    ],
)  # fmt: skip
def test_bad_scenarios_name_the_field(scenario: ElasticScenario, field: str) -> None:
    with pytest.raises(ScenarioError, match=f"^{field}"):
        scenario.validate()


def test_availability_traces_parse_or_name_the_bad_item() -> None:
    assert parse_availability("1,1,0,1") == (1, 1, 0, 1)
    assert parse_availability("1101\n") == (1, 1, 0, 1)
    with pytest.raises(ScenarioError, match=r"preemption.trace: item 2 is '2'"):
        parse_availability("1 1 2")
    with pytest.raises(ScenarioError, match="empty"):
        parse_availability("  ")


def test_warp_replays_the_trace_faster_in_a_burst() -> None:
    records = [(float(t), 1000) for t in range(600)]  # 1 request/s for 10 minutes
    profile = RateProfile("burst", 4.0, period_s=300, burst_s=100, offset_s=100)
    arrivals = list(warp(records, profile, 300.0))
    in_burst = sum(1 for a in arrivals if 100 <= a.arrival_s < 200)
    before = sum(1 for a in arrivals if a.arrival_s < 100)
    assert before == pytest.approx(100, abs=2) and in_burst == pytest.approx(400, abs=4)
    assert [a.index for a in arrivals] == list(range(len(arrivals)))


def test_the_steady_state_bound_counts_each_interval() -> None:
    from prfaas.sim.elastic.bound import steady_state_bound

    offered = [(10.0, 50_000), (20.0, 50_000), (310.0, 10_000)]
    # 100k tokens in the first 300 s: 333 tokens/s over 1000 x 0.5 per node -> 1 node.
    assert steady_state_bound(offered, 300, 1000, 0.5, 900) == ((0, 1), (300, 1), (600, 0))
    heavy = [(float(t), 10_000) for t in range(300)]  # 10k tokens/s
    assert steady_state_bound(heavy, 300, 1000, 0.8, 300) == ((0, 13),)
