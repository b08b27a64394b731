"""The pool simulator routes each tenant's requests with the tenant file's router, the object the
live gateway routes with (``policy.route_pool_tenant`` over ``sim/pool_view.py``): a ``prfaas``
router whose link to the pool is saturated keeps long prompts home (counted as keeps for the
link, ``kept_local.link``, the live ``reason="link"``), the same stream over a fast link is
offloaded, and a ``threshold`` router reads no link."""

from __future__ import annotations

import pytest

from prfaas.core.ids import NodeId, SiteId
from prfaas.core.topology import NodeRole
from prfaas.perf import cost_model_for
from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.policy.pool_tenant_route import POOL_NODE, POOL_SITE
from prfaas.sim.pool_report import pool_summary
from prfaas.sim.pool_scenario import PoolSimGroup, PoolSimScenario, PoolSimTenant
from prfaas.sim.pool_sim import PoolSimulator
from prfaas.workload import ArrivalSpec, FixedLengths

pytestmark = pytest.mark.timeout(60)

H200 = cost_model_for("paper-1t", "h200")
H20 = cost_model_for("paper-1t", "h20")
LONG = 32_000
"""0.73 GB of KV: ~6 s on a 1 Gbps link, 1.8 s to prefill at the pool, 4.9 s at home."""
TRACE = tuple((2.0 * i, LONG) for i in range(12))
"""A long prompt every 2 s: eight home prefill nodes are never all busy."""


def _run(router: str, link_gbps: float) -> tuple[PoolSimulator, dict]:
    tenant = PoolSimTenant(
        "a", "paper-1t", ArrivalSpec("poisson", 1.0), FixedLengths(LONG), 8, H20,
        link_gbps * 1e9 / 8, rtt_s=0.01, threshold_tokens=4096, tuner="fixed", trace=TRACE,
        home_site="pd-a", router=router, router_remote=H200, router_local=H20,
    )  # fmt: skip
    shape = PoolShape((GroupShape("g", "paper-1t", 4),), 400e9 / 8, (TenantShare("a", 1.0),))
    sc = PoolSimScenario(
        shape, (PoolSimGroup("g", "paper-1t", 4, H200),), (tenant,), duration_s=30.0
    )
    sim = PoolSimulator(sc)
    sim.run()
    return sim, pool_summary(sim)


def test_a_saturated_link_keeps_long_prompts_home_a_fast_one_offloads_them() -> None:
    _, slow = _run("prfaas", link_gbps=1.0)
    r = slow["tenants"]["a"]["requests"]
    assert r["arrived"] == len(TRACE) and r["completed"] == len(TRACE)
    # The first goes to the pool (an idle link); while its KV crawls over the link (backlog over
    # 1 s of it: scarce), the next ones' first token comes sooner at an idle home node.
    assert r["offloaded"] >= 1 and r["kept_local"]["link"] >= len(TRACE) // 2
    assert r["offloaded"] + r["kept_local"]["link"] == len(TRACE)
    assert r["local"] == r["kept_local"]["link"] and r["kept_local"]["expected_queueing"] == 0

    _, fast = _run("prfaas", link_gbps=400.0)
    r = fast["tenants"]["a"]["requests"]
    assert r["offloaded"] == len(TRACE) and r["kept_local"]["link"] == 0 and r["local"] == 0


def test_a_threshold_router_reads_no_link() -> None:
    _, out = _run("threshold", link_gbps=1.0)
    r = out["tenants"]["a"]["requests"]
    assert r["offloaded"] == len(TRACE) and r["kept_local"]["link"] == 0


def test_the_view_is_the_tenants_two_sites() -> None:
    """What the router reads: the pool node's offloads in flight, the link's backlog from the
    egress (the admission's ``link_backlog_s`` at the link's rate), the home FIFO's nodes."""
    sim, _ = _run("prfaas", link_gbps=1.0)
    run = sim.tenants["a"]
    view = run.view
    assert view is not None
    home, pool = SiteId("pd-a"), SiteId(POOL_SITE)
    assert list(view.site_ids()) == [home, pool]
    assert view.link(home, pool) is None
    link = view.link(pool, home)
    assert link is not None and link.capacity_bytes_per_s == 1e9 / 8
    assert link.backlog_bytes == 0 and not link.congested  # the run drained
    assert run.pool_in_flight == 0 and run.pool_in_flight_tokens == 0
    assert view.least_loaded_id(pool, NodeRole.PREFILL) == NodeId(POOL_NODE)
    assert len(view.nodes(home, NodeRole.PREFILL)) == 8
    loads = view.nodes(home, NodeRole.PREFILL)
    assert all(n.queue_depth == 0 and view.work_left_s(n.node_id) == 0.0 for n in loads)
    assert view.threshold_tokens == 4096


def test_the_link_the_router_reads_is_the_tenants_kv_in_flight() -> None:
    """At every routing, the view's ``pool -> home`` backlog is the tenant's prefills' whole KV
    from their start at a pool node until their last byte is sent (what the live door says as
    ``link_backlog_s``), at least the simulated admission's unsent KV."""
    seen: list[tuple[int, float, float]] = []

    class Recording(PoolSimulator):
        def _routes_to_pool(self, run, req):  # type: ignore[no-untyped-def]
            assert run.view is not None
            state = run.view.link(SiteId(POOL_SITE), SiteId("pd-a"))
            whole = sum(f.kv_bytes for f in self.egress.flows if f.tenant == "a")
            unsent = self.admission.feedback("a", self.now, self._egress_state()).link_backlog_s
            seen.append((state.backlog_bytes, whole, unsent * run.spec.link_bytes_per_s))
            return super()._routes_to_pool(run, req)

    sim, _ = _run("prfaas", link_gbps=1.0)
    rec = Recording(sim.sc)
    rec.run()
    assert len(seen) == len(TRACE) and any(b > 0 for b, _, _ in seen)
    for backlog, whole, unsent in seen:
        assert backlog == pytest.approx(whole, abs=1.0) and backlog >= unsent - 1.0
