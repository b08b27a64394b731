"""A pool tenant's routing, one function for the live gateway and the pool simulator (issue 21:
the same policy object live and simulated; ``docs/pool.md``, *The tenant's router reads its
link* and *The simulator*).

``route_pool_tenant`` asks the router of the tenant's file (``policy.make_router``, the object a
two-site deployment routes with) over a ``ClusterView`` where the pool is the PrfaaS site
``POOL_SITE`` of one prefill node ``POOL_NODE`` and the tenant's link to the pool is the
``pool -> home`` link, then:

- says whether the file's router kept the request home for that link (``KEPT_FOR_LINK``: the
  ``prfaas`` router's *scarce* keep), which the driver counts (live
  ``prfaas_pool_kept_local_total{reason="link"}``, simulated ``kept_local.link``);
- applies the coordinated gate (``policy.keeps_local``): a request the file's router would
  offload stays home when the pool's expected queueing for the tenant is over its TTFT target
  and the home queue is shorter (``KEPT_FOR_QUEUEING``).

The gate's inputs are the driver's (``GateReading``, asked for only when the file's router
offloads and the tenant is coordinated): live, the latest feedback and the registry's home
prefill work (``pool.tenant_tuner.home_prefill``); simulated, the admission's feedback at that
instant and the tenant's own ``T_local`` sum.

``pool_link_state`` is the ``pool -> home`` ``LinkState`` the live gateway's registry builds from
the pool's feedback (``pool.feedback_link.pool_node_rows`` then ``serve.gateway.registry``): the
backlog is the feedback's ``link_backlog_s`` at the told rate; the pool says no delivered bytes,
so goodput and utilisation are 0; ``congested`` by the one ``core.CongestionRule``. The pool
simulator builds its link with it from its egress fluid. Pure: no I/O, ``now`` passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

from prfaas.core.congestion import CongestionRule
from prfaas.core.ids import LinkId, SiteId
from prfaas.core.topology import NodeRole
from prfaas.core.views import ClusterView, LinkState, RequestView, new_link_state
from prfaas.policy.decisions import RouteDecision
from prfaas.policy.placement import least_loaded
from prfaas.policy.pool_coordination import keeps_local
from prfaas.policy.router import Router

POOL_SITE = "pool"
"""The pool, to a tenant's router and registry: one PrfaaS site..."""
POOL_NODE = "pool"
"""...of one prefill node."""
KeptReason = Literal["link", "expected_queueing"]
KEPT_FOR_LINK: Final[KeptReason] = "link"
KEPT_FOR_QUEUEING: Final[KeptReason] = "expected_queueing"
CONGESTION = CongestionRule()
"""The registry's rule (``serve.gateway.registry.CONGESTION``): the default thresholds."""
_PREFILL = NodeRole.PREFILL


@dataclass(frozen=True, slots=True)
class GateReading:
    """What the coordinated gate reads, from the driver."""

    expected_queueing_s: float
    """The pool's expected queueing for this tenant (its feedback)."""
    local_backlog_s: float
    """Seconds of prefill work sent to the home prefill nodes and not ended."""
    num_local_prefill: int
    """Home prefill nodes taking work."""


class PoolTenantRoute(NamedTuple):
    """One routing's answer (a named tuple: one is made per request, and a frozen dataclass's
    ``__init__`` costs the simulator's routing several times more)."""

    decision: RouteDecision
    kept: KeptReason | None = None
    """Why a request the tenant would otherwise offload stays home (None: not kept)."""


def kept_home_for_the_link(decision: RouteDecision) -> bool:
    """Whether the file's router kept a request home because of its link: ``policy.router``'s
    ``prfaas`` router marks only that decision local, ``rerouted`` and without a cache move (its
    other ``rerouted`` local decision moves the PrfaaS site's cache home)."""
    return not decision.offloaded and decision.rerouted and decision.cache_move is None


def route_pool_tenant(
    inner: Router,
    request: RequestView,
    cluster: ClusterView,
    now: float,
    home: SiteId,
    ttft_target_s: float | None = None,
    gate: Callable[[], GateReading | None] | None = None,
) -> PoolTenantRoute:
    """``inner``'s decision for ``request``, and for a coordinated tenant (``ttft_target_s`` and
    ``gate`` given; ``gate()`` None: no feedback yet, no gate) the keep-local gate."""
    decision = inner.route(request, cluster, now)
    if not decision.offloaded:
        # ``kept_home_for_the_link``, inlined (once a request in the simulator).
        if decision.rerouted and decision.cache_move is None:
            return PoolTenantRoute(decision, KEPT_FOR_LINK)
        return PoolTenantRoute(decision)
    if ttft_target_s is None or gate is None:
        return PoolTenantRoute(decision)
    said = gate()
    if said is None or not keeps_local(
        said.expected_queueing_s, ttft_target_s, said.local_backlog_s, said.num_local_prefill
    ):
        return PoolTenantRoute(decision)
    load = least_loaded(cluster, home, _PREFILL)
    if load is None:
        return PoolTenantRoute(decision)
    reason = (
        f"kept local: the pool's expected queueing {said.expected_queueing_s:.2f} s > target "
        f"{ttft_target_s:g} s"
    )
    cached = request.cached_tokens_at(home)
    home_decision = RouteDecision(load.site_id, load.node_id, cached, False, reason, None, True)
    return PoolTenantRoute(home_decision, KEPT_FOR_QUEUEING)


def pool_link_state(
    link_id: LinkId,
    told_bytes_per_s: float,
    link_backlog_s: float,
    now: float,
    *,
    capacity_bytes_per_s: float | None = None,
    capacity_basis: str = "configured",
    rtt_s: float = 0.0,
    retransmit_rate: float = 0.0,
) -> LinkState:
    """The tenant's ``pool -> home`` link as the registry reads the pool's feedback: backlog the
    feedback's ``link_backlog_s`` at the told rate (``told_bytes_per_s``, modelled), capacity the
    told rate unless the pool's senders measured one, goodput and utilisation 0 (the pool says no
    delivered bytes), congested by ``CONGESTION`` (its backlog's drain time, its loss)."""
    cap = told_bytes_per_s if capacity_bytes_per_s is None else capacity_bytes_per_s
    backlog = round(max(0.0, link_backlog_s) * told_bytes_per_s)
    drain = backlog / cap if cap > 0 else (float("inf") if backlog else 0.0)
    congested = CONGESTION.congested(0.0, drain, retransmit_rate)
    return new_link_state(
        link_id, cap, 0.0, 0.0, backlog, rtt_s, retransmit_rate, congested, now, capacity_basis
    )
