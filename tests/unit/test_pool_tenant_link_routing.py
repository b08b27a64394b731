"""A pool tenant's router reads its own link to the pool from the pool's feedback
(``pool/feedback_link.py``, ``pool/tenant.py`` ``TenantPoolLink._node_alive``,
``pool/tenant_router.py``): the feedback's link backlog and reading become the ``pool -> home``
link of the gateway's registry as a PrfaaS node process's heartbeat makes its link, so the
``prfaas`` router of the tenant's file keeps a long prompt home while that link is backlogged and
offloads it while the link is idle; a keep for the link is counted by reason."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from prfaas.config import load_deployment
from prfaas.core import MutableClusterView, RequestId, RequestView, SiteId, SiteKind
from prfaas.core.ids import link_id_for
from prfaas.core.views import LinkState
from prfaas.policy import make_router
from prfaas.policy.pool_tenant_route import GateReading, pool_link_state, route_pool_tenant
from prfaas.pool.client import Feedback, LinkFeedback, LinkReadingFeedback
from prfaas.pool.feedback_link import pool_node_rows
from prfaas.pool.tenant import POOL_NODE, POOL_SITE, TenantPoolLink, with_pool_site
from prfaas.pool.tenant_router import TenantRouter
from prfaas.pool.tenant_tuner import home_prefill, per_token_s
from prfaas.scenarios import deployment_cost_models
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import NodeEndpoint, Registration

pytestmark = pytest.mark.timeout(60)

TENANT_FILE = Path(__file__).resolve().parents[2] / "examples" / "pool" / "tenant-a.yaml"
LINK_GBPS = 100.0  # the example tenant's pool.link
LONG_PROMPT = 60_000


def _feedback(link_backlog_s: float, unacked_bytes: int = 0, basis: str = "measured") -> Feedback:
    reading = LinkReadingFeedback(
        pace_gbps=LINK_GBPS, capacity_gbps=80.0, basis=basis, backlog_bytes=unacked_bytes,
        rtt_s=0.01, retransmit_rate=0.0, num_senders=1,
    )  # fmt: skip
    return Feedback(
        epoch=1, tenant="tenant-a", expected_queueing_s=0.0, entitled_share=1.0,
        attainable_share=1.0, queued_tokens=0, running=2, link_backlog_s=link_backlog_s,
        link=LinkFeedback(gbps=LINK_GBPS, rtt_ms=10.0, reading=reading),
    )  # fmt: skip


@pytest.fixture
def tenant(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[TenantPoolLink, TenantRouter, CollectorRegistry]:
    """Tenant A of the examples (router ``prfaas``), live: its home prefill nodes registered and
    idle, the ``pool`` node kept by its ``TenantPoolLink``, its router as the gateway builds it."""
    monkeypatch.setenv("PRFAAS_POOL_KEY_A", "k" * 32)
    d = with_pool_site(load_deployment(TENANT_FILE))
    assert d.policy.router == "prfaas"
    view = MutableClusterView({SiteId(s.name): SiteKind(s.kind) for s in d.sites}, 4096)
    registry = NodeRegistry(d, view)
    for i in range(3):
        ep = NodeEndpoint(node=f"a-p{i}", site="pd-a", role="prefill", host="mem", http_port=1)
        registry.register(Registration(process=f"a-p{i}", nodes=[ep]), 0.0)
    metrics = CollectorRegistry()
    link = TenantPoolLink(d, registry, metrics)
    remote, local = deployment_cost_models(d)
    home = SiteId(d.home_site.name)
    inner = make_router(d.policy.router, home, [SiteId(POOL_SITE)], remote=remote, local=local)
    router = TenantRouter(inner, home, lambda: link.feedback, metrics)
    return link, router, metrics


def _pool_link(link: TenantPoolLink) -> LinkState:
    state = link.registry.view.link(SiteId(POOL_SITE), SiteId("pd-a"))
    assert state is not None
    return state


def _route(link: TenantPoolLink, router: TenantRouter, fb: Feedback) -> tuple[bool, str]:
    link.feedback = fb
    link._node_alive(time.monotonic())
    decision = router.route(RequestView(RequestId("r"), LONG_PROMPT), link.registry.view, 0.0)
    return decision.offloaded, decision.prefill_node


def test_a_backlogged_link_keeps_a_long_prompt_home_an_idle_one_offloads_it(
    tenant: tuple[TenantPoolLink, TenantRouter, CollectorRegistry],
) -> None:
    link, router, metrics = tenant

    def kept(reason: str) -> float:
        return metrics.get_sample_value("prfaas_pool_kept_local_total", {"reason": reason}) or 0.0

    assert _route(link, router, _feedback(link_backlog_s=0.0)) == (True, POOL_NODE)
    assert kept("link") == 0
    # 30 s of KV ahead of it on its own link: scarce, and its first token comes sooner at home.
    offloaded, node = _route(link, router, _feedback(link_backlog_s=30.0, unacked_bytes=10**9))
    assert not offloaded and node.startswith("a-p")
    assert kept("link") == 1 and kept("expected_queueing") == 0
    state = _pool_link(link)
    assert state.congested and state.drain_time_s() > 30.0
    # The link drained: offloaded again, nothing more counted.
    assert _route(link, router, _feedback(link_backlog_s=0.0)) == (True, POOL_NODE)
    assert kept("link") == 1


def test_the_registry_reads_the_pools_link_as_a_prfaas_sites(
    tenant: tuple[TenantPoolLink, TenantRouter, CollectorRegistry],
) -> None:
    link, _, _ = tenant
    before = _pool_link(link)  # the file's rate until the pool says anything
    assert before.capacity_bytes_per_s == LINK_GBPS * 1e9 / 8 and before.backlog_bytes == 0
    told = LINK_GBPS * 1e9 / 8
    link.feedback = _feedback(link_backlog_s=2.0, unacked_bytes=5 * 10**9)
    link._node_alive(time.monotonic())
    state = _pool_link(link)
    # Backlog: the running prefills' whole KV (2 s at the told rate), of which 5 GB is with the
    # senders (counted once); capacity: the pool's measured estimate; RTT from the reading.
    assert state.backlog_bytes == pytest.approx(2.0 * told, rel=1e-6)
    assert state.capacity_bytes_per_s == 80e9 / 8 and state.capacity_basis == "measured"
    assert state.rtt_s == 0.01 and state.link_id == link_id_for(SiteId(POOL_SITE), SiteId("pd-a"))
    # The node's report keeps its queue from the feedback.
    assert link.registry.last_report[POOL_NODE].queue_depth == 2


def test_rows_without_a_reading_or_feedback() -> None:
    told = LINK_GBPS * 1e9 / 8
    kw = {"node": POOL_NODE, "site": POOL_SITE, "link_id": "pool->pd-a",
          "told_bytes_per_s": told, "byte_divisor": 1000}  # fmt: skip
    report, links = pool_node_rows(None, **kw)  # type: ignore[arg-type]
    assert links == [] and report.egress_backlog_bytes == 0 and report.queue_depth == 0
    older = Feedback(1, "tenant-a", 0.0, 1.0, 1.0, 0, 1, link_backlog_s=1.0)  # no link said
    report, links = pool_node_rows(older, **kw)  # type: ignore[arg-type]
    assert links == [] and report.egress_backlog_bytes == round(told / 1000)
    unestimated = _feedback(link_backlog_s=0.5, unacked_bytes=10**10, basis="")
    report, links = pool_node_rows(unestimated, **kw)  # type: ignore[arg-type]
    # Not counted as the senders' bytes by the registry: the larger figure is the node's own.
    assert [lk.basis for lk in links] == [""] and report.egress_backlog_bytes == 10**10 // 1000


def test_the_pure_route_is_the_live_routers_decision(
    tenant: tuple[TenantPoolLink, TenantRouter, CollectorRegistry],
) -> None:
    """``policy.route_pool_tenant`` (what the pool simulator routes with) decides as the live
    ``TenantRouter`` on the same view and feedback, gate included; and ``pool_link_state`` (the
    simulator's link) is the registry's reading of the same feedback."""
    link, _, _ = tenant
    d = link.deployment
    remote, local = deployment_cost_models(d)
    assert local is not None
    home, pool = SiteId("pd-a"), SiteId(POOL_SITE)
    pool_sites = [pool]
    live = TenantRouter(
        make_router(d.policy.router, home, pool_sites, remote=remote, local=local),
        home, lambda: link.feedback, CollectorRegistry(), 4.0, local,
    )  # fmt: skip
    inner = make_router(d.policy.router, home, pool_sites, remote=remote, local=local)
    view = link.registry.view
    told = LINK_GBPS * 1e9 / 8
    kinds: set[tuple[bool, str | None]] = set()
    for backlog_s, basis in ((0.0, "measured"), (0.5, "configured"), (2.0, "measured"),
                             (30.0, "configured")):  # fmt: skip
        for queueing_s in (0.0, 10.0):
            fb = replace(_feedback(backlog_s, basis=basis), expected_queueing_s=queueing_s)
            link.feedback = fb
            link._node_alive(time.monotonic())

            def gate(fb: Feedback = fb) -> GateReading:
                num_local, backlog = home_prefill(view, home, per_token_s(local))
                return GateReading(fb.expected_queueing_s, backlog, num_local)

            for n in (1000, LONG_PROMPT):
                request = RequestView(RequestId("r"), n)
                pure = route_pool_tenant(inner, request, view, 0.0, home, 4.0, gate)
                assert live.route(request, view, 0.0) == pure.decision
                kinds.add((pure.decision.offloaded, pure.kept))
            state = _pool_link(link)
            measured = basis == "measured"
            mine = pool_link_state(
                state.link_id, told, backlog_s, state.sampled_at_s,
                capacity_bytes_per_s=80e9 / 8 if measured else None, capacity_basis=basis,
                rtt_s=0.01,
            )  # fmt: skip
            assert replace(state, backlog_bytes=0) == replace(mine, backlog_bytes=0)
            # The registry counts the node's unsent bytes in payload bytes (its divisor).
            divisor = d.engine.real_bytes_per_payload_byte
            assert abs(state.backlog_bytes - mine.backlog_bytes) <= divisor
    # Offloaded, kept for the link, kept for the pool's queueing, short ones home: all seen.
    assert {(True, None), (False, "link"), (False, "expected_queueing"), (False, None)} <= kinds
