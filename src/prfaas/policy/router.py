"""Routers: where a request's prefill runs (site and node) and which cache it reuses.

One router instance serves one PD site (its *home*: where the request decodes and the client is);
several PD sites sharing PrfaaS sites each have their own. Four policies:
- ``local_only``: homogeneous PD, every prefill at the home PD-P pool.
- ``naive``: every prefill at a PrfaaS site (all prefill on the compute-dense hardware).
- ``threshold``: the paper's static rule: PrfaaS when the uncached length at home exceeds ``t``.
- ``prfaas``: the paper's short-timescale rules. Bandwidth is *scarce* when a PrfaaS link is
  congested (its ``LinkState.congested``, set by the link's producer with ``core.CongestionRule``)
  or would be under the same rule with the router's earlier thresholds (``BandwidthRules``:
  utilisation and backlog drain time, so the router backs off before the link congests); then only
  the home cache counts
  (``l_total - l_pd > t`` offloads) and, beyond the paper, a request that would offload is kept
  local (``rerouted``) when its estimated first-token time is earlier there: remote = max(prefill
  queue + ``T_prfaas(l)``, link backlog + its own bytes at the link's capacity), local = prefill
  queue + ``T_local(l)`` (cost models given), or, without cost models, when the link backlog
  exceeds ``max_link_wait_s`` and the local queue is short. When bandwidth is
  *abundant*, the longest prefix anywhere counts (``l_total - max(l_prfaas, l_pd) > t``) and the
  longer cache is moved to where the prefill runs. ``t`` itself is re-searched by
  ``ThresholdTuner`` when the link or the queues change.
Pure, synchronous, ``now`` passed in; imports no simulator code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from prfaas.core.congestion import CongestionRule
from prfaas.core.ids import NodeId, SiteId
from prfaas.core.topology import NodeRole
from prfaas.core.views import ClusterView, LinkState, NodeLoad, RequestView
from prfaas.perf import CostModel
from prfaas.policy.decisions import CacheMove, RouteDecision, new_route_decision
from prfaas.policy.placement import least_loaded, work_left_s

ROUTER_NAMES = ("local_only", "naive", "threshold", "prfaas")
_PREFILL = NodeRole.PREFILL
"""A module constant: reading an enum member off its class costs ~150 ns on Python 3.11, and a
router asks for the prefill role once or twice a request."""


class NoRouteError(RuntimeError):
    """No site can prefill this request (e.g. no prefill node anywhere reachable)."""


class Router(Protocol):
    name: str

    def route(self, request: RequestView, cluster: ClusterView, now: float) -> RouteDecision: ...


@dataclass(frozen=True, slots=True)
class BandwidthRules:
    """When the ``prfaas`` router calls bandwidth scarce, and when it keeps a request local."""

    scarce_utilisation: float = 0.85
    """Egress goodput over capacity over which bandwidth is scarce (below the links' congestion
    threshold: the router backs off first)."""
    scarce_drain_s: float = 1.0
    """Transfer backlog (seconds at current capacity) over which bandwidth is scarce."""
    max_link_wait_s: float = 2.0
    """When scarce, keep a long request local if the link backlog would delay it this long..."""
    max_local_queue: int = 4
    """...and the least-loaded home prefill node has fewer than this many requests waiting."""
    max_local_wait_s: float = 0.0
    """With cost models: reroute only to a home prefill node with at most this much work queued
    (0: only an idle node), and only if the request's first token comes sooner there."""


def _decision(
    load: NodeLoad, cached: int, offloaded: bool, reason: str,
    cache_move: CacheMove | None = None, rerouted: bool = False,
) -> RouteDecision:  # fmt: skip
    # One per routed request: the fast constructor (``core.frozen``).
    return new_route_decision(
        load.site_id, load.node_id, cached, offloaded, reason, cache_move, rerouted
    )


class _Base:
    name = "base"

    def __init__(self, home_site: SiteId, prfaas_sites: Sequence[SiteId] = ()) -> None:
        self.home_site = home_site
        self.prfaas_sites = tuple(prfaas_sites)

    def _local(self, cluster: ClusterView) -> NodeLoad | None:
        return least_loaded(cluster, self.home_site, _PREFILL)

    def _local_id(self, cluster: ClusterView) -> NodeId | None:
        """``_local``'s node, without building its ``NodeLoad`` when the view can say which
        (the simulator's, as for ``DecodePlacement``): a decision names only the node."""
        fast = getattr(cluster, "least_loaded_id", None)
        if fast is not None:
            node: NodeId | None = fast(self.home_site, _PREFILL)
            return node
        load = self._local(cluster)
        return None if load is None else load.node_id

    def _link(self, cluster: ClusterView, site: SiteId) -> LinkState | None:
        return cluster.link(site, self.home_site)

    def _remote(
        self, cluster: ClusterView, request: RequestView, prefer_cache: bool
    ) -> tuple[NodeLoad, LinkState | None] | None:
        """The PrfaaS node to use: best cache first (if asked), then the emptier link and queue."""
        best: tuple[tuple[float, float, int], NodeLoad, LinkState | None] | None = None
        for site in self.prfaas_sites:
            link = self._link(cluster, site)
            if link is not None and link.capacity_bytes_per_s <= 0:
                continue
            load = least_loaded(cluster, site, _PREFILL)
            if load is None:
                continue
            cached = request.cached_tokens_at(site) if prefer_cache else 0
            drain = link.drain_time_s() if link is not None else 0.0
            key = (-float(cached), drain, load.queued_tokens)
            if best is None or key < best[0]:
                best = (key, load, link)
        return None if best is None else (best[1], best[2])

    def _no_route(self, request: RequestView) -> NoRouteError:
        return NoRouteError(f"request {request.request_id}: no prefill node can take it")


class LocalOnlyRouter(_Base):
    name = "local_only"

    def route(self, request: RequestView, cluster: ClusterView, now: float) -> RouteDecision:
        node = self._local_id(cluster)
        if node is None:
            raise self._no_route(request)
        home = self.home_site
        cached = request.cached_tokens_at(home)
        return new_route_decision(home, node, cached, False, "local_only", None, False)


class NaiveRouter(_Base):
    name = "naive"

    def route(self, request: RequestView, cluster: ClusterView, now: float) -> RouteDecision:
        remote = self._remote(cluster, request, prefer_cache=True)
        if remote is None:
            raise self._no_route(request)
        load = remote[0]
        return _decision(load, request.cached_tokens_at(load.site_id), True, "naive: all remote")


class ThresholdRouter(_Base):
    name = "threshold"

    def route(self, request: RequestView, cluster: ClusterView, now: float) -> RouteDecision:
        t = cluster.threshold_tokens
        cached_home = request.cached_tokens_at(self.home_site)
        uncached = request.num_prompt_tokens - cached_home
        local = None if uncached > t else self._local_id(cluster)
        if local is None:
            remote = self._remote(cluster, request, prefer_cache=False)
            if remote is not None:
                load = remote[0]
                cached = request.cached_tokens_at(load.site_id)
                return _decision(load, cached, True, f"uncached {uncached} > t {t}")
            local = self._local_id(cluster)
        if local is None:
            raise self._no_route(request)
        reason = f"uncached {uncached} <= t {t}"
        return new_route_decision(self.home_site, local, cached_home, False, reason, None, False)


class BandwidthAwareRouter(_Base):
    """The ``prfaas`` router (see the module docstring)."""

    name = "prfaas"

    def __init__(
        self,
        home_site: SiteId,
        prfaas_sites: Sequence[SiteId] = (),
        rules: BandwidthRules | None = None,
        remote: CostModel | None = None,
        local: CostModel | None = None,
    ) -> None:
        super().__init__(home_site, prfaas_sites)
        self.rules = rules or BandwidthRules()
        self.remote = remote
        self.local = local
        # Rough per-token prefill cost, used only when a view cannot say how long a queue is.
        self._per_token_s = local.prefill_s(8192) / 8192 if local is not None else 0.0
        # Scarcity is the congestion rule itself at the router's thresholds; the link's own
        # verdict (``LinkState.congested``) is read, never re-derived.
        self._scarcity = CongestionRule(
            max_utilisation=self.rules.scarce_utilisation, max_drain_s=self.rules.scarce_drain_s
        )

    def is_scarce(self, link: LinkState | None) -> bool:
        if link is None:
            return False
        return link.congested or self._scarcity.congested(link.utilisation, link.drain_time_s())

    def _local_is_sooner(
        self, request: RequestView, cluster: ClusterView, rload: NodeLoad, local: NodeLoad,
        link: LinkState, l_pd: int, l_prfaas: int,
    ) -> bool:  # fmt: skip
        if self.remote is None or self.local is None:
            return (
                link.drain_time_s() > self.rules.max_link_wait_s
                and local.queue_depth < self.rules.max_local_queue
            )
        total = request.num_prompt_tokens
        pt = self._per_token_s
        remote_compute = work_left_s(cluster, rload, pt) + self.remote.prefill_s(
            total - l_prfaas, l_prfaas
        )
        nbytes = self.remote.kv_bytes(total - l_pd)
        cap = link.capacity_bytes_per_s
        remote_done = max(remote_compute, (link.backlog_bytes + nbytes) / cap if cap > 0 else 1e18)
        local_wait = work_left_s(cluster, local, pt)
        if local_wait > self.rules.max_local_wait_s:
            # Short requests have nowhere else to go: only spare local capacity is borrowed.
            return False
        local_done = local_wait + self.local.prefill_s(total - l_pd, l_pd)
        return local_done < remote_done

    def route(self, request: RequestView, cluster: ClusterView, now: float) -> RouteDecision:
        t = cluster.threshold_tokens
        total = request.num_prompt_tokens
        home = self.home_site
        l_pd = request.cached_tokens_at(home)
        local = self._local(cluster)
        remote = self._remote(cluster, request, prefer_cache=True)
        if remote is None:
            if local is None:
                raise self._no_route(request)
            return _decision(local, l_pd, False, "no PrfaaS site reachable")
        rload, link = remote
        l_prfaas = request.cached_tokens_at(rload.site_id)
        if local is None:
            return _decision(rload, l_prfaas, True, "no home prefill node")
        if self.is_scarce(link):
            if total - l_pd <= t:
                return _decision(local, l_pd, False, f"scarce: uncached {total - l_pd} <= t {t}")
            assert link is not None
            if self._local_is_sooner(request, cluster, rload, local, link, l_pd, l_prfaas):
                return _decision(
                    local, l_pd, False, "scarce: sooner locally than over the link", rerouted=True
                )
            return _decision(rload, l_prfaas, True, f"scarce: uncached {total - l_pd} > t {t}")
        l_prefix = max(l_prfaas, l_pd)
        if total - l_prefix <= t:
            move = CacheMove(rload.site_id, home, l_prfaas) if l_prfaas > l_pd else None
            return _decision(
                local, l_prefix, False, f"abundant: uncached {total - l_prefix} <= t {t}",
                cache_move=move, rerouted=(total - l_pd > t),
            )  # fmt: skip
        move = CacheMove(home, rload.site_id, l_pd) if l_pd > l_prfaas else None
        return _decision(
            rload, l_prefix, True, f"abundant: uncached {total - l_prefix} > t {t}", cache_move=move
        )


def make_router(
    name: str,
    home_site: SiteId,
    prfaas_sites: Sequence[SiteId],
    rules: BandwidthRules | None = None,
    remote: CostModel | None = None,
    local: CostModel | None = None,
) -> Router:
    if name == "local_only":
        return LocalOnlyRouter(home_site, prfaas_sites)
    if name == "naive":
        return NaiveRouter(home_site, prfaas_sites)
    if name == "threshold":
        return ThresholdRouter(home_site, prfaas_sites)
    if name == "prfaas":
        return BandwidthAwareRouter(home_site, prfaas_sites, rules, remote, local)
    raise ValueError(f"unknown router {name!r} (known: {', '.join(ROUTER_NAMES)})")
