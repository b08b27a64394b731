"""The observations a routing policy reads: a request, node loads, link states, the cluster.

Policies take these, never the driver's internals. ``RequestView``, ``NodeLoad`` and ``LinkState``
are immutable snapshots. ``ClusterView`` is a read-only *interface* (a Protocol): a driver keeps one
``MutableClusterView`` up to date incrementally (one node or link at a time, as reports arrive)
instead of building a fresh snapshot of a 1,250-node cluster for every decision.
Pure: no I/O, no clock reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from prfaas.core.frozen import writable_twin
from prfaas.core.ids import LinkId, NodeId, RequestId, SiteId, link_id_for
from prfaas.core.topology import NodeRole, SiteKind

_EMPTY: Mapping[SiteId, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RequestView:
    """What the router knows about one request when it decides."""

    request_id: RequestId
    num_prompt_tokens: int
    cached_tokens_by_site: Mapping[SiteId, int] = field(default_factory=lambda: _EMPTY)
    """Longest usable cached prefix (tokens) at each site, from the global KV manager."""
    block_hashes: tuple[int, ...] = ()
    max_output_tokens: int = 1

    def cached_tokens_at(self, site_id: SiteId) -> int:
        return self.cached_tokens_by_site.get(site_id, 0)

    def uncached_tokens_at(self, site_id: SiteId) -> int:
        return self.num_prompt_tokens - self.cached_tokens_at(site_id)


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """One node's load as last reported."""

    node_id: NodeId
    site_id: SiteId
    role: NodeRole
    queue_depth: int = 0
    """Requests waiting (not yet started) at this node."""
    queued_tokens: int = 0
    """Uncached prompt tokens waiting (prefill nodes) or context tokens waiting (decode nodes)."""
    batch_size: int = 0
    """Requests in the running batch (decode) or being prefilled."""
    kv_used_bytes: int = 0
    kv_capacity_bytes: int = 0
    draining: bool = False
    """Being converted to another role: takes no new work."""
    healthy: bool = True
    sampled_at_s: float = 0.0

    @property
    def kv_free_bytes(self) -> int:
        return max(0, self.kv_capacity_bytes - self.kv_used_bytes)

    @property
    def accepting(self) -> bool:
        return self.healthy and not self.draining


@dataclass(frozen=True, slots=True)
class LinkState:
    """An immutable snapshot of one directed inter-site link, as the transfer monitor saw it.

    ``congested`` is set by the producer of the snapshot (the transfer monitor live, the link model
    in the simulator) with its documented thresholds; policies only read it.
    """

    link_id: LinkId
    capacity_bytes_per_s: float
    """The rate KV traffic may use now (shaped or measured: ``capacity_basis``)."""
    utilisation: float = 0.0
    """Goodput over capacity, 0..1 (may exceed 1 briefly when capacity just dropped)."""
    goodput_bytes_per_s: float = 0.0
    backlog_bytes: int = 0
    """Bytes accepted for sending and not yet delivered."""
    rtt_s: float = 0.0
    retransmit_rate: float = 0.0
    """Retransmitted segments over sent segments in the last sampling interval."""
    congested: bool = False
    sampled_at_s: float = 0.0
    capacity_basis: str = "configured"
    """Where ``capacity_bytes_per_s`` comes from: "configured" (the deployment file's or the
    shaped rate; the simulator's link model) or "measured" (the live senders' estimate,
    ``core.link_estimate``)."""

    def drain_time_s(self) -> float:
        """How long the current backlog takes to clear at full capacity."""
        if self.capacity_bytes_per_s <= 0:
            return float("inf") if self.backlog_bytes > 0 else 0.0
        return self.backlog_bytes / self.capacity_bytes_per_s


# Fast constructors for the hot paths (``core.frozen``): every field given, in field order; the
# same object as the class's own ``__init__`` builds, 3-4x cheaper to make.
_WritableRequestView = writable_twin(RequestView)
_WritableNodeLoad = writable_twin(NodeLoad)
_WritableLinkState = writable_twin(LinkState)


def new_request_view(
    request_id: RequestId,
    num_prompt_tokens: int,
    cached_tokens_by_site: Mapping[SiteId, int],
    block_hashes: tuple[int, ...],
    max_output_tokens: int,
) -> RequestView:
    """``RequestView(...)`` with every field, built fast (the simulator: one per request)."""
    view: Any = object.__new__(_WritableRequestView)
    view.request_id = request_id
    view.num_prompt_tokens = num_prompt_tokens
    view.cached_tokens_by_site = cached_tokens_by_site
    view.block_hashes = block_hashes
    view.max_output_tokens = max_output_tokens
    view.__class__ = RequestView
    built: RequestView = view  # typed without ``cast`` (a call)
    return built


def new_node_load(
    node_id: NodeId, site_id: SiteId, role: NodeRole, queue_depth: int, queued_tokens: int,
    batch_size: int, kv_used_bytes: int, kv_capacity_bytes: int, draining: bool, healthy: bool,
    sampled_at_s: float,
) -> NodeLoad:  # fmt: skip
    """``NodeLoad(...)`` with every field, built fast (the simulator's nodes, when asked)."""
    load: Any = object.__new__(_WritableNodeLoad)
    load.node_id = node_id
    load.site_id = site_id
    load.role = role
    load.queue_depth = queue_depth
    load.queued_tokens = queued_tokens
    load.batch_size = batch_size
    load.kv_used_bytes = kv_used_bytes
    load.kv_capacity_bytes = kv_capacity_bytes
    load.draining = draining
    load.healthy = healthy
    load.sampled_at_s = sampled_at_s
    load.__class__ = NodeLoad
    built: NodeLoad = load  # typed without ``cast`` (a call)
    return built


def new_link_state(
    link_id: LinkId, capacity_bytes_per_s: float, utilisation: float, goodput_bytes_per_s: float,
    backlog_bytes: int, rtt_s: float, retransmit_rate: float, congested: bool,
    sampled_at_s: float, capacity_basis: str,
) -> LinkState:  # fmt: skip
    """``LinkState(...)`` with every field, built fast (the simulator's links, when asked)."""
    state: Any = object.__new__(_WritableLinkState)
    state.link_id = link_id
    state.capacity_bytes_per_s = capacity_bytes_per_s
    state.utilisation = utilisation
    state.goodput_bytes_per_s = goodput_bytes_per_s
    state.backlog_bytes = backlog_bytes
    state.rtt_s = rtt_s
    state.retransmit_rate = retransmit_rate
    state.congested = congested
    state.sampled_at_s = sampled_at_s
    state.capacity_basis = capacity_basis
    state.__class__ = LinkState
    built: LinkState = state  # typed without ``cast`` (a call)
    return built


class ClusterView(Protocol):
    """Read-only view of the cluster that policies consume. Drivers implement or reuse
    ``MutableClusterView``; policies must not mutate what they get."""

    def site_ids(self) -> Sequence[SiteId]: ...

    def site_kind(self, site_id: SiteId) -> SiteKind: ...

    def nodes(self, site_id: SiteId, role: NodeRole) -> Sequence[NodeLoad]:
        """Nodes at ``site_id`` currently in ``role`` (draining ones included, flagged)."""
        ...

    def node(self, node_id: NodeId) -> NodeLoad: ...

    def link(self, src_site: SiteId, dst_site: SiteId) -> LinkState | None: ...

    @property
    def threshold_tokens(self) -> int:
        """The offload threshold ``t`` now in force."""
        ...


class MutableClusterView:
    """A dict-backed ``ClusterView`` that a driver updates one report at a time.

    Reads are O(1) for a node or link and O(nodes at that site in that role) for ``nodes``; the
    per-(site, role) tuples are rebuilt lazily only after a membership change.
    """

    def __init__(
        self,
        site_kinds: Mapping[SiteId, SiteKind],
        threshold_tokens: int = 0,
        node_order: Sequence[NodeId] = (),
    ) -> None:
        """``node_order``: ``nodes`` lists a site's nodes in this order (those not named after,
        as they arrived), whatever order they registered in, so ties between equally loaded
        nodes go the same way in every run and as in the simulator (its node index order)."""
        self._rank: dict[NodeId, int] = {n: i for i, n in enumerate(node_order)}
        self._site_kinds: dict[SiteId, SiteKind] = dict(site_kinds)
        self._site_order: tuple[SiteId, ...] = tuple(site_kinds)
        self._nodes: dict[NodeId, NodeLoad] = {}
        self._links: dict[LinkId, LinkState] = {}
        self._groups: dict[tuple[SiteId, NodeRole], dict[NodeId, None]] = {}
        self._group_cache: dict[tuple[SiteId, NodeRole], tuple[NodeLoad, ...]] = {}
        self._threshold_tokens = threshold_tokens

    # -- reads (the ClusterView protocol) ------------------------------------------------------
    def site_ids(self) -> Sequence[SiteId]:
        return self._site_order

    def site_kind(self, site_id: SiteId) -> SiteKind:
        return self._site_kinds[site_id]

    def nodes(self, site_id: SiteId, role: NodeRole) -> Sequence[NodeLoad]:
        key = (site_id, role)
        cached = self._group_cache.get(key)
        if cached is None:
            group = list(self._groups.get(key, {}))
            if self._rank:
                last = len(self._rank)
                group.sort(key=lambda n: self._rank.get(n, last))  # stable: arrivals keep order
            cached = tuple(self._nodes[n] for n in group)
            self._group_cache[key] = cached
        return cached

    def node(self, node_id: NodeId) -> NodeLoad:
        return self._nodes[node_id]

    def link(self, src_site: SiteId, dst_site: SiteId) -> LinkState | None:
        return self._links.get(link_id_for(src_site, dst_site))

    @property
    def threshold_tokens(self) -> int:
        return self._threshold_tokens

    def __iter__(self) -> Iterator[NodeLoad]:
        return iter(self._nodes.values())

    # -- writes (drivers only) -----------------------------------------------------------------
    def update_node(self, load: NodeLoad) -> None:
        if load.site_id not in self._site_kinds:
            raise KeyError(f"node {load.node_id} reports unknown site {load.site_id}")
        old = self._nodes.get(load.node_id)
        self._nodes[load.node_id] = load
        new_key = (load.site_id, load.role)
        if old is not None and (old.site_id, old.role) != new_key:
            old_key = (old.site_id, old.role)
            self._groups[old_key].pop(load.node_id, None)
            self._group_cache.pop(old_key, None)
        self._groups.setdefault(new_key, {})[load.node_id] = None
        self._group_cache.pop(new_key, None)

    def remove_node(self, node_id: NodeId) -> None:
        old = self._nodes.pop(node_id, None)
        if old is not None:
            key = (old.site_id, old.role)
            self._groups[key].pop(node_id, None)
            self._group_cache.pop(key, None)

    def update_link(self, state: LinkState) -> None:
        self._links[state.link_id] = state

    def set_threshold_tokens(self, threshold_tokens: int) -> None:
        if threshold_tokens < 0:
            raise ValueError(f"threshold must be >= 0 tokens, got {threshold_tokens}")
        self._threshold_tokens = threshold_tokens
