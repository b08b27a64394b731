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

The decision itself is ``policy.pool_tenant_route.route_pool_tenant``, the function the pool
simulator routes each tenant's requests with (the same file's router over its own view); this
class adds the feedback it reads and the counter.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from prfaas.core import ClusterView, RequestView, SiteId
from prfaas.perf import CostModel
from prfaas.policy import Router
from prfaas.policy.decisions import RouteDecision
from prfaas.policy.pool_tenant_route import (
    GateReading,
    kept_home_for_the_link,
    route_pool_tenant,
)
from prfaas.pool.client import Feedback
from prfaas.pool.tenant_tuner import home_prefill, per_token_s

__all__ = ["TenantRouter", "kept_home_for_the_link"]


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
        gated = self.ttft_target_s is not None and self.per_token_s is not None
        route = route_pool_tenant(
            self.inner, request, cluster, now, self.home, self.ttft_target_s,
            (lambda: self._gate(cluster)) if gated else None,
        )  # fmt: skip
        if route.kept is not None:
            self.kept_local.labels(reason=route.kept).inc()
        return route.decision

    def _gate(self, cluster: ClusterView) -> GateReading | None:
        """The gate's inputs: the latest feedback's expected queueing, and the home prefill
        work the registry tracks (None: no feedback yet)."""
        fb = self._feedback()
        if fb is None or self.per_token_s is None:
            return None
        num_local, backlog_s = home_prefill(cluster, self.home, self.per_token_s)
        return GateReading(fb.expected_queueing_s, backlog_s, num_local)
