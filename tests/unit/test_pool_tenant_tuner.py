"""A live tenant's coordinated tuner and router gate (``pool/tenant_tuner.py``): it asks
``choose_threshold`` with the inputs the pool simulator builds for the same tenant (same files,
lengths, rate, feedback and local backlog), a smaller share from the feedback raises ``t``, an
uncoordinated tenant ignores the feedback, and a request the router would offload stays home by
the simulator's gate (``policy.keeps_local``), counted by reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from prfaas.commands.sim_pool import build_pool_scenario
from prfaas.config import load_deployment
from prfaas.core import (
    MutableClusterView,
    NodeId,
    NodeLoad,
    NodeRole,
    RequestId,
    RequestView,
    SiteId,
    SiteKind,
)
from prfaas.policy import TuningConfig
from prfaas.policy.pool_coordination import PoolSaid, ThresholdChoice
from prfaas.policy.router import ThresholdRouter
from prfaas.pool import tenant_tuner
from prfaas.pool.app import shape_json
from prfaas.pool.client import Feedback, PoolShapeFeedback
from prfaas.pool.tenant import POOL_NODE, POOL_SITE, with_pool_site
from prfaas.pool.tenant_router import TenantRouter
from prfaas.pool.tenant_tuner import TenantTuner, per_token_s
from prfaas.pool_file import load_pool, pool_shape
from prfaas.scenarios import deployment_cost_models
from prfaas.serve.gateway.control import ControlLoop
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import NodeEndpoint, Registration
from prfaas.sim import pool_tuning
from prfaas.sim.kv_bytes import KvBytes

pytestmark = pytest.mark.timeout(60)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pool"
POOL_FILE, TENANT_FILE = EXAMPLES / "pool.yaml", EXAMPLES / "tenant-a.yaml"
LENGTHS = tuple(range(1000, 100_000, 500))
QUEUED_AT_P1 = 20_000
"""Uncached tokens of a prefill at the tenant's second home prefill node."""


def _shape() -> PoolShapeFeedback:
    """The pool's shape as the front door's feedback says it (``pool.app``)."""
    raw = {"epoch": 1, "tenant": "tenant-a", "expected_queueing_s": 0.0, "entitled_share": 1.0,
           "attainable_share": 1.0, "queued_tokens": 0, "running": 0,
           "pool": shape_json(pool_shape(load_pool(POOL_FILE)))}  # fmt: skip
    shape = Feedback.from_json(raw).pool
    assert shape is not None
    return shape


def _feedback(share: float, queueing_s: float = 0.0, link_backlog_s: float = 0.0) -> Feedback:
    return Feedback(
        epoch=1, tenant="tenant-a", expected_queueing_s=queueing_s, entitled_share=2 / 3,
        attainable_share=share, queued_tokens=0, running=1, link_backlog_s=link_backlog_s,
        pool=_shape(),
    )  # fmt: skip


def _tuner(feedback: list[Feedback | None], tuner: str = "coordinated") -> TenantTuner:
    """Tenant A of the examples, live: its three home prefill nodes registered (one with a
    prefill), its window holding ``LENGTHS`` at 2 requests per modelled second."""
    d = load_deployment(TENANT_FILE)
    assert d.pool is not None
    d = with_pool_site(d.model_copy(update={"pool": d.pool.model_copy(update={"tuner": tuner})}))
    view = MutableClusterView({SiteId(s.name): SiteKind(s.kind) for s in d.sites}, 4096)
    registry = NodeRegistry(d, view)
    for i in range(3):
        node = f"a-p{i}"
        ep = NodeEndpoint(node=node, site="pd-a", role="prefill", host="mem", http_port=1)
        registry.register(Registration(process=node, nodes=[ep]), 0.0)
    registry.track("a-p1", "r0", QUEUED_AT_P1)  # a prefill the gateway sent there, not ended
    remote, local = deployment_cost_models(d)
    assert remote is not None and local is not None
    control = ControlLoop(registry, remote, local, False, False, TuningConfig())
    for i, n in enumerate(LENGTHS):  # what ``ControlLoop.observe`` records, at set times
        control.policy.observe(n, 16, i * 0.5)
    return TenantTuner(d, control, lambda: feedback[0], local, remote, CollectorRegistry())


def _recorder(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    real = module.choose_threshold

    def record(*args: Any) -> ThresholdChoice:
        calls.append(args)
        out: ThresholdChoice = real(*args)
        return out

    monkeypatch.setattr(module, "choose_threshold", record)
    return calls


def test_live_tuner_asks_choose_threshold_what_the_simulator_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live_calls = _recorder(monkeypatch, tenant_tuner)
    sim_calls = _recorder(monkeypatch, pool_tuning)
    fb = _feedback(share=0.4, queueing_s=12.0, link_backlog_s=3.0)
    tuner = _tuner([fb])
    assert tuner.tick(0.0) is None  # the first period starts
    assert tuner.tick(29.9) is None and live_calls == []
    choice = tuner.tick(30.0)
    assert choice is not None and len(live_calls) == 1

    sc = build_pool_scenario(POOL_FILE, [TENANT_FILE])
    (spec,) = sc.tenants
    kv = KvBytes(sc.group_for(spec.model).cost.model.cache).total
    window = tuner.control.window
    local_backlog_s = QUEUED_AT_P1 * per_token_s(tuner.local)
    sim_t = pool_tuning.tenant_threshold(
        spec, sc, kv, LENGTHS, window.rate_rps(), PoolSaid.of(fb), local_backlog_s
    )
    ((live_load, live_pool, live_local, live_remote),) = live_calls
    ((sim_load, sim_pool, sim_local, sim_remote, _),) = sim_calls
    assert live_load == sim_load and live_pool == sim_pool
    assert (live_pool.share, live_pool.expected_queueing_s, live_pool.link_backlog_s) == (
        0.4, 12.0, 3.0,
    )  # fmt: skip
    assert (live_pool.num_pool_nodes, live_load.num_local_prefill) == (4, 3)
    assert live_load.drain_horizon_s == sc.tune_interval_s
    for n in (1000, 30_000, 99_500):  # the same hardware prices the same prompt alike
        assert live_local.prefill_s(n) == sim_local.prefill_s(n)
        assert live_remote.prefill_s(n) == sim_remote.prefill_s(n)
        assert live_remote.kv_bytes(n) == kv(n)  # live: the default, the cost model's S_kv
    assert choice.threshold_tokens == sim_t
    # The choice is the gateway's t, logged as any threshold update, and exported.
    assert tuner.registry.view.threshold_tokens == sim_t != 4096
    (update,) = tuner.control.log.threshold_updates
    assert update["threshold_tokens"] == sim_t and "share 0.400" in str(update["reason"])
    state = tuner.state()
    assert state["num_choices"] == 1 and state["threshold_tokens"] == sim_t
    assert tuner.share._value.get() == 0.4 and tuner.queueing._value.get() == 12.0


def test_a_smaller_share_raises_t_and_uncoordinated_ignores_it() -> None:
    said = [_feedback(share=1.0)]
    tuner = _tuner(said)
    tuner.tick(0.0)
    whole = tuner.tick(30.0)
    said[0] = _feedback(share=0.25)
    quarter = tuner.tick(60.0)
    assert whole is not None and quarter is not None
    assert quarter.threshold_tokens > whole.threshold_tokens
    assert tuner.registry.view.threshold_tokens == quarter.threshold_tokens
    assert [c["share"] for c in tuner.choices] == [1.0, 0.25]

    blind = _tuner([_feedback(share=0.25, queueing_s=50.0)], tuner="uncoordinated")
    blind.tick(0.0)
    chosen = blind.tick(30.0)
    assert chosen is not None and chosen.threshold_tokens == whole.threshold_tokens
    assert blind.choices[-1]["share"] == 1.0 and blind.choices[-1]["expected_queueing_s"] == 0


def test_no_choice_without_the_pools_shape_or_enough_lengths() -> None:
    said: list[Feedback | None] = [None]
    tuner = _tuner(said)
    tuner.tick(0.0)
    assert tuner.tick(30.0) is None and "no pool shape" in tuner.waiting
    tuner.min_samples = len(LENGTHS) + 1
    said[0] = _feedback(share=1.0)
    assert tuner.tick(60.0) is None
    assert tuner.waiting == f"{len(LENGTHS)} of {len(LENGTHS) + 1} lengths observed"
    assert tuner.registry.view.threshold_tokens == 4096 and tuner.num_choices == 0


def _view(queued_home_tokens: int) -> MutableClusterView:
    view = MutableClusterView({SiteId("pd-a"): SiteKind.PD, SiteId(POOL_SITE): SiteKind.PRFAAS},
                              4096)  # fmt: skip
    view.update_node(NodeLoad(NodeId("a-p0"), SiteId("pd-a"), NodeRole.PREFILL,
                              queued_tokens=queued_home_tokens))  # fmt: skip
    view.update_node(NodeLoad(NodeId(POOL_NODE), SiteId(POOL_SITE), NodeRole.PREFILL))
    return view


def test_the_router_keeps_an_offload_home_while_the_pool_queues_over_the_target() -> None:
    d = with_pool_site(load_deployment(TENANT_FILE))
    _, local = deployment_cost_models(d)
    assert local is not None
    said: list[Feedback | None] = [None]
    metrics = CollectorRegistry()
    inner = ThresholdRouter(SiteId("pd-a"), [SiteId(POOL_SITE)])
    router = TenantRouter(inner, SiteId("pd-a"), lambda: said[0], metrics, 4.0, local)
    long, short = (RequestView(RequestId(r), n) for r, n in (("long", 10_000), ("short", 2000)))
    idle = _view(0)

    def kept() -> float:
        return metrics.get_sample_value("prfaas_pool_kept_local_total",
                                        {"reason": "expected_queueing"}) or 0.0  # fmt: skip

    assert router.route(long, idle, 0.0).offloaded  # no feedback yet: the file's router
    said[0] = _feedback(share=1.0, queueing_s=4.0)  # at the target, not over it
    assert router.route(long, idle, 0.0).offloaded
    said[0] = _feedback(share=1.0, queueing_s=10.0)
    home = router.route(long, idle, 0.0)
    assert not home.offloaded and home.prefill_node == "a-p0" and home.rerouted
    assert "expected queueing 10.00 s > target 4 s" in home.reason and kept() == 1
    assert router.route(short, idle, 0.0).prefill_node == "a-p0" and kept() == 1
    # The home queue (one node, over 10 s of work) is longer than the pool's: offloaded.
    busy = _view(int(11.0 / per_token_s(local)))
    assert router.route(long, busy, 0.0).offloaded and kept() == 1
