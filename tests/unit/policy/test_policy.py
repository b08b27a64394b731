"""Policies on the generic ``MutableClusterView`` (not the simulator's): the decisions are the
driver-independent code the live gateway will call."""

from __future__ import annotations

import random

import pytest

from prfaas.analytic import plan
from prfaas.core import LinkState, MutableClusterView, NodeLoad, NodeRole, RequestView, SiteKind
from prfaas.core.ids import LinkId, NodeId, RequestId, SiteId
from prfaas.perf import cost_model_for
from prfaas.policy import (
    BandwidthAwareRouter,
    DecodeAdmission,
    LengthWindow,
    LocalOnlyRouter,
    NaiveRouter,
    NoRouteError,
    PrefillBatcher,
    Rebalancer,
    SampleCapacity,
    ThresholdRouter,
    ThresholdTuner,
    make_router,
)
from prfaas.workload import TruncatedLogNormal

PD, FAR = SiteId("pd"), SiteId("far")
GB = 1e9 / 8


def _view(n_p: int = 3, n_d: int = 5, n_far: int = 4, t: int = 19628) -> MutableClusterView:
    v = MutableClusterView({PD: SiteKind.PD, FAR: SiteKind.PRFAAS}, threshold_tokens=t)
    for i in range(n_p):
        v.update_node(NodeLoad(NodeId(f"pd/p{i}"), PD, NodeRole.PREFILL, queued_tokens=i * 100))
    for i in range(n_d):
        v.update_node(NodeLoad(NodeId(f"pd/d{i}"), PD, NodeRole.DECODE, kv_capacity_bytes=10**12))
    for i in range(n_far):
        v.update_node(NodeLoad(NodeId(f"far/p{i}"), FAR, NodeRole.PREFILL, queued_tokens=50 - i))
    v.update_link(LinkState(LinkId("far->pd"), 100 * GB))
    return v


def _req(n: int, cached: dict[SiteId, int] | None = None) -> RequestView:
    return RequestView(RequestId("r"), n, cached or {})


def test_threshold_rule_on_uncached_length() -> None:
    r = ThresholdRouter(PD, [FAR])
    v = _view()
    long = r.route(_req(30000), v, 0.0)
    assert long.offloaded and long.prefill_site == FAR and long.prefill_node == "far/p3"
    short = r.route(_req(10000), v, 0.0)
    assert not short.offloaded and short.prefill_node == "pd/p0"
    # A long prompt whose uncached part at home is short stays home.
    cached = r.route(_req(30000, {PD: 20000}), v, 0.0)
    assert not cached.offloaded and cached.num_cached_tokens == 20000


def test_local_only_and_naive() -> None:
    v = _view()
    assert not LocalOnlyRouter(PD, [FAR]).route(_req(100000), v, 0.0).offloaded
    assert NaiveRouter(PD, [FAR]).route(_req(200), v, 0.0).offloaded
    with pytest.raises(NoRouteError):
        NaiveRouter(PD, []).route(_req(200), v, 0.0)
    with pytest.raises(ValueError, match="unknown router"):
        make_router("magic", PD, [FAR])


def test_prfaas_abundant_uses_the_longest_prefix_and_moves_it() -> None:
    r = BandwidthAwareRouter(PD, [FAR])
    v = _view()
    d = r.route(_req(40000, {FAR: 30000, PD: 5000}), v, 0.0)
    # 40000 - max(30000, 5000) = 10000 <= t: local prefill, PrfaaS cache moved home.
    assert not d.offloaded and d.num_cached_tokens == 30000
    assert (
        d.cache_move is not None
        and d.cache_move.src_site == FAR
        and d.cache_move.num_tokens == 30000
    )
    d2 = r.route(_req(80000, {PD: 30000}), v, 0.0)
    assert d2.offloaded and d2.cache_move is not None and d2.cache_move.dst_site == FAR


def test_prfaas_scarce_ignores_remote_cache_and_keeps_work_local_when_sooner() -> None:
    remote, local = cost_model_for("paper-1t", "h200"), cost_model_for("paper-1t", "h20")
    r = BandwidthAwareRouter(PD, [FAR], remote=remote, local=local)
    v = _view()
    v.update_node(NodeLoad(NodeId("pd/p0"), PD, NodeRole.PREFILL))  # an idle local node
    v.update_link(LinkState(LinkId("far->pd"), 1 * GB, utilisation=0.99, backlog_bytes=int(60e9)))
    assert r.is_scarce(v.link(FAR, PD))
    d = r.route(_req(25000, {FAR: 20000}), v, 0.0)  # scarce: only the home cache counts
    assert not d.offloaded and d.rerouted  # 60 s of link backlog vs ~4 s of local prefill
    v.update_link(LinkState(LinkId("far->pd"), 10 * GB, utilisation=0.99, backlog_bytes=0))
    assert r.route(_req(25000), v, 0.0).offloaded  # 1.5 s on H200 + 0.5 s of link vs 3.9 s


def test_prefill_batching_and_decode_admission() -> None:
    b = PrefillBatcher(10000)
    assert b.next_batch([4000, 5000, 2000]).num_requests == 2
    assert b.next_batch([20000, 10]).num_requests == 1
    assert b.next_batch([]).num_requests == 0
    adm = DecodeAdmission(20)
    load = NodeLoad(NodeId("d"), PD, NodeRole.DECODE, batch_size=19, kv_capacity_bytes=100)
    assert adm.admit(load, 100).admit and not adm.admit(load, 101).admit
    full = NodeLoad(NodeId("d"), PD, NodeRole.DECODE, batch_size=20, kv_capacity_bytes=100)
    assert adm.admit(full, 1).reason == "batch full"


def _window(n: int = 4000, rate: float = 2.5) -> LengthWindow:
    w = LengthWindow(n)
    d = TruncatedLogNormal()
    for i, x in zip(range(n), d.stratified(random.Random(0)), strict=False):
        w.observe(x, 1024, i / rate)
    return w


def test_sample_capacity_agrees_with_the_planner() -> None:
    remote, local = cost_model_for("paper-1t", "h200"), cost_model_for("paper-1t", "h20")
    sample = SampleCapacity(_window().prompt_lengths(), remote.prefill_s, local.prefill_s,
                            local.kv_bytes)  # fmt: skip
    best = sample.best_split(4, 8, 20 / (0.025 * 1024), 100 * GB)
    assert (best.num_prefill, best.num_decode) == (3, 5)
    exact = plan().prfaas.lambda_max_exact
    assert best.lambda_rps == pytest.approx(exact, rel=0.03)
    assert best.threshold_tokens == pytest.approx(19628, rel=0.1)


def test_tuner_raises_t_when_the_link_cannot_carry_the_load() -> None:
    remote, local = cost_model_for("paper-1t", "h200"), cost_model_for("paper-1t", "h20")
    tuner = ThresholdTuner(PD, [FAR], remote, local)
    v = _view()
    w = _window()  # 2.5 requests/s, ~80% of capacity
    assert tuner.maybe_retune(v, 0.0, w) is None  # the planned t fits at 100 Gbps
    v.update_link(LinkState(LinkId("far->pd"), 5 * GB))
    upd = tuner.maybe_retune(v, 1.0, w)
    assert upd is not None and upd.threshold_tokens > 19628
    assert upd.reason == "link capacity changed"


def test_rebalancer_moves_a_skewed_split_to_three_five() -> None:
    remote, local = cost_model_for("paper-1t", "h200"), cost_model_for("paper-1t", "h20")
    reb = Rebalancer(PD, [FAR], remote, local)
    v = _view(n_p=6, n_d=2)
    plan_ = reb.plan(v, 100.0, _window())
    assert plan_ is not None
    assert (plan_.target_num_prefill, plan_.target_num_decode) == (3, 5)
    assert len(plan_.changes) == 3
    assert all(
        c.src_role is NodeRole.PREFILL and c.dst_role is NodeRole.DECODE for c in plan_.changes
    )
    assert reb.plan(_view(), 200.0, _window()) is None  # 3/5 is already balanced


def test_a_batch_takes_a_step_per_budget_of_its_tokens() -> None:
    """The chunks a mixed-step engine cuts a batch into (``sim.processor``): at least one."""
    batcher = PrefillBatcher(2048)
    assert [batcher.steps(n) for n in (1, 2048, 2049, 6144, 6145)] == [1, 1, 2, 3, 4]
    assert batcher.steps(0) == 1
