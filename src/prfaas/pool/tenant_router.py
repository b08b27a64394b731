"""``TenantRouter``: a pool tenant's router (issue 21; ``docs/pool.md``, *The threshold
coordination rule* and *The tenant's router reads its link*).

It wraps the router of the tenant's file (``policy.make_router``: the objects a two-site
deployment routes with) and keeps no rule of its own for the link: the tenant's link to the pool
is the ``pool -> home`` link of the gateway's registry, fed from the pool's feedback
(``pool.feedback_link``), which a bandwidth-aware router (``prfaas``) reads as it reads a PrfaaS
site's link. What it adds:

- **counts**: a request the file's router kept home for the link (the ``prfaas`` router's
  *scarce* rule: local, ``rerouted``, no cache move) is counted
  ``prfaas_pool_kept_local_total{reason="link"}``;
- **the coordinated gate** (``pool.tuner: coordinated``): a request the file's router would
  offload stays home when ``policy.keeps_local`` says so (the pool's expected queueing for the
  tenant, from the latest feedback, over ``pool.ttft_target_s`` and the home queue shorter: the
  pool simulator's gate), counted ``reason="expected_queueing"``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from prfaas.core import ClusterView, NodeRole, RequestView, SiteId
from prfaas.perf import CostModel
from prfaas.policy import Router
from prfaas.policy.decisions import RouteDecision
from prfaas.policy.placement import least_loaded
from prfaas.policy.pool_coordination import keeps_local
from prfaas.pool.client import Feedback
from prfaas.pool.tenant_tuner import home_prefill, per_token_s


def kept_home_for_the_link(decision: RouteDecision) -> bool:
    """Whether the file's router kept a request home because of its link: ``policy.router``'s
    ``prfaas`` router marks only that decision local, ``rerouted`` and without a cache move (its
    other ``rerouted`` local decision moves the PrfaaS site's cache home)."""
    return not decision.offloaded and decision.rerouted and decision.cache_move is None


class TenantRouter:
    """A pool tenant's router: ``inner``'s decision, its keeps for the link counted, and for a
    coordinated tenant (``ttft_target_s`` and ``local`` given) the feedback's keep-local gate."""

    def __init__(
        self,
        inner: Router,
        home: SiteId,
        feedback: Callable[[], Feedback | None],
        metrics: CollectorRegistry,
        ttft_target_s: float | None = None,
        local: CostModel | None = None,
    ) -> None:
        """``feedback()``: the pool's latest ``Feedback`` or None; ``ttft_target_s`` and
        ``local`` (the home prefill cost model): the coordinated gate (None: no gate)."""
        self.inner = inner
        self.name = inner.name
        self.home = home
        self.ttft_target_s = ttft_target_s
        self.per_token_s = None if local is None else per_token_s(local)
        self._feedback = feedback
        self.kept_local = Counter(
            "pool_kept_local", "Requests kept home that the router would otherwise have "
            "offloaded to the pool, by reason (link: the tenant's link to the pool, as the "
            "pool's feedback reads it, scarce and the first token sooner at home; "
            "expected_queueing: the pool's expected queueing for this tenant over "
            "pool.ttft_target_s, the home queue shorter)", ["reason"],
            namespace="prfaas", registry=metrics,
        )  # fmt: skip

    def route(self, request: RequestView, cluster: ClusterView, now: float) -> RouteDecision:
        decision = self.inner.route(request, cluster, now)
        if not decision.offloaded:
            if kept_home_for_the_link(decision):
                self.kept_local.labels(reason="link").inc()
            return decision
        if self.ttft_target_s is None or self.per_token_s is None:
            return decision
        fb = self._feedback()
        if fb is None:
            return decision
        num_local, backlog_s = home_prefill(cluster, self.home, self.per_token_s)
        if not keeps_local(fb.expected_queueing_s, self.ttft_target_s, backlog_s, num_local):
            return decision
        load = least_loaded(cluster, self.home, NodeRole.PREFILL)
        if load is None:
            return decision
        self.kept_local.labels(reason="expected_queueing").inc()
        reason = (
            f"kept local: the pool's expected queueing {fb.expected_queueing_s:.2f} s > target "
            f"{self.ttft_target_s:g} s"
        )
        cached = request.cached_tokens_at(self.home)
        return RouteDecision(load.site_id, load.node_id, cached, False, reason, None, True)
