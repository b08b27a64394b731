"""``PoolTenantView``: the ``ClusterView`` a pool simulator tenant's router reads, the live
tenant gateway's view of the same things (``docs/pool.md``, *The simulator*).

Two sites, as ``pool.tenant.with_pool_site`` makes them live: the tenant's home PD site with its
local prefill nodes, and the pool as the PrfaaS site ``policy.POOL_SITE`` of one prefill node
``policy.POOL_NODE``, linked to home by the tenant's own link. Read on demand from the
simulator's state (nothing is built per event, a ``NodeLoad`` or ``LinkState`` only when a router
asks for it):

- **home prefill nodes**: the tenant's FIFO local queue over its nodes. A free node is idle (no
  queue, no work left; the FIFO is empty while a node is free); a busy one has the whole FIFO
  ahead of it (``queue_depth``, ``queued_tokens``) and, as work left, the tenant's local backlog
  (each queued or running request's ``T_local``, the gate's figure) over its nodes.
- **the pool node**: the tenant's offloads in flight (accepted, their KV not yet arrived), as the
  live registry counts the work its gateway sent a prefill node and has not seen end
  (``NodeRegistry.track``: the pool node's queue and tokens live are these, not the feedback's);
  its work left is those tokens at the router's local per-token estimate, as a live router prices
  a view without ``work_left_s``.
- **the ``pool -> home`` link**: ``policy.pool_link_state`` of the tenant's KV in flight (each
  of its prefills' whole KV from its start at a pool node until its last byte is sent,
  ``PoolEgress.in_flight_bytes``: what the live front door's feedback says as
  ``link_backlog_s``, the placed prefills' whole KV until their outcomes) at its link's rate,
  the conversion the live registry makes of the feedback: goodput and utilisation 0, congested
  by the backlog's drain time. Not the simulated admission's ``link_backlog_s`` (KV produced
  and not yet sent, what the simulated tuner reads): the live door does not say that figure.

A ``NodeLoad`` or ``LinkState`` is built again only when its figures changed (its
``sampled_at_s`` is when it was built, as a live row's is its last report's): the router reads
them on every request and most requests find them as they were. Pure: no I/O, the simulator's
``now`` read from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prfaas.core.ids import NodeId, SiteId, link_id_for
from prfaas.core.topology import NodeRole, SiteKind
from prfaas.core.views import LinkState, NodeLoad, new_node_load
from prfaas.policy.pool_tenant_route import POOL_NODE, POOL_SITE, pool_link_state
from prfaas.sim.pool_egress import PoolEgress
from prfaas.sim.pool_scenario import PoolSimTenant

_PREFILL = NodeRole.PREFILL


class _Queued(Protocol):
    @property
    def num_tokens(self) -> int: ...


class TenantRun(Protocol):
    """What the view reads of a tenant's run (``sim.pool_tenant_run.TenantRun``; a protocol, so this
    module does not import the simulator that imports it)."""

    @property
    def spec(self) -> PoolSimTenant: ...
    @property
    def threshold_tokens(self) -> int: ...
    @property
    def local_free(self) -> int: ...
    @property
    def local_queue(self) -> Sequence[_Queued]: ...
    @property
    def local_work_s(self) -> float: ...
    @property
    def pool_in_flight(self) -> int: ...
    @property
    def pool_in_flight_tokens(self) -> int: ...


class _Clock(Protocol):
    """The simulator: its ``now`` (an attribute read, not a call: the router asks it a few
    times per request)."""

    @property
    def now(self) -> float: ...


PER_TOKEN_PROBE_TOKENS = 8192
"""``pool.tenant_tuner.per_token_s``'s probe, the ``prfaas`` router's own estimate."""


class PoolTenantView:
    def __init__(self, run: TenantRun, egress: PoolEgress, clock: _Clock) -> None:
        spec = run.spec
        self._run = run
        self._egress = egress
        self._clock = clock
        self.home = SiteId(spec.home_site)
        self.pool = SiteId(POOL_SITE)
        self.pool_node = NodeId(POOL_NODE)
        self._sites = (self.home, self.pool)
        self._k = spec.num_local_prefill
        self._local_ids = tuple(NodeId(f"{spec.home_site}-p{i}") for i in range(self._k))
        self._index = {n: i for i, n in enumerate(self._local_ids)}
        self._link_id = link_id_for(self.pool, self.home)
        self._tenant = spec.name
        self._rate = spec.link_bytes_per_s
        self._rtt_s = spec.rtt_s
        # Built when their figures change, reused while they do not (``sampled_at_s``: when
        # built; a live row's is its last report's): the router asks for them every request.
        self._link: LinkState | None = None
        self._link_backlog_s = 0.0
        self._pool: NodeLoad | None = None
        self._pool_figures = (0, 0)
        self._idle: list[NodeLoad | None] = [None] * self._k
        cm = spec.router_local if spec.router_local is not None else spec.local_cost
        self._per_token_s = cm.prefill_s(PER_TOKEN_PROBE_TOKENS) / PER_TOKEN_PROBE_TOKENS

    # -- the ClusterView protocol --------------------------------------------------------------
    def site_ids(self) -> Sequence[SiteId]:
        return self._sites

    def site_kind(self, site_id: SiteId) -> SiteKind:
        if site_id == self.home:
            return SiteKind.PD
        if site_id == self.pool:
            return SiteKind.PRFAAS
        raise KeyError(site_id)

    def nodes(self, site_id: SiteId, role: NodeRole) -> Sequence[NodeLoad]:
        if role is not _PREFILL:
            return ()  # decode is not modelled
        if site_id == self.home:
            return tuple(self._local_load(i) for i in range(self._k))
        if site_id == self.pool:
            return (self._pool_load(),)
        return ()

    def node(self, node_id: NodeId) -> NodeLoad:
        if node_id == self.pool_node:
            return self._pool_load()
        return self._local_load(self._index[node_id])

    def link(self, src_site: SiteId, dst_site: SiteId) -> LinkState | None:
        if src_site != self.pool or dst_site != self.home:
            return None
        rate = self._rate
        # The live feedback's ``link_backlog_s`` (the placed prefills' whole KV over the link's
        # rate), back to bytes by the registry's conversion.
        backlog_s = self._egress.in_flight_bytes(self._tenant) / rate
        cached = self._link
        if cached is not None and backlog_s == self._link_backlog_s:
            return cached  # unchanged (an idle link, mostly): the state built when it was read
        state = pool_link_state(self._link_id, rate, backlog_s, self._clock.now, rtt_s=self._rtt_s)
        self._link, self._link_backlog_s = state, backlog_s
        return state

    @property
    def threshold_tokens(self) -> int:
        return self._run.threshold_tokens

    # -- the IndexedClusterView extension (``policy.placement``) -------------------------------
    def least_loaded(self, site_id: SiteId, role: NodeRole) -> NodeLoad | None:
        if role is not _PREFILL:
            return None
        if site_id == self.pool:
            return self._pool_load()
        i = self._least_loaded_index(site_id)
        return None if i is None else self._local_load(i)

    def least_loaded_id(self, site_id: SiteId, role: NodeRole) -> NodeId | None:
        if role is not _PREFILL:
            return None
        if site_id == self.pool:
            return self.pool_node
        i = self._least_loaded_index(site_id)
        return None if i is None else self._local_ids[i]

    def work_left_s(self, node_id: NodeId) -> float:
        run = self._run
        if node_id == self.pool_node:
            return run.pool_in_flight_tokens * self._per_token_s
        if self._index[node_id] >= self._k - run.local_free:
            return 0.0  # a free node: the FIFO is empty
        # Busy: the tenant's local backlog (each queued or running request's ``T_local``, the
        # gate's figure) over its nodes: the FIFO's work ahead of a new request, running
        # prefills counted whole.
        return run.local_work_s / self._k

    # -- internals -----------------------------------------------------------------------------
    def _least_loaded_index(self, site_id: SiteId) -> int | None:
        if site_id != self.home or self._k == 0:
            return None
        busy = self._k - self._run.local_free
        return busy if busy < self._k else 0  # the first free node, else the FIFO's head

    def _local_load(self, i: int) -> NodeLoad:
        run = self._run
        if i >= self._k - run.local_free:
            idle = self._idle[i]
            if idle is None:
                idle = new_node_load(
                    self._local_ids[i], self.home, _PREFILL, 0, 0, 0, 0, 0, False, True,
                    self._clock.now,
                )  # fmt: skip
                self._idle[i] = idle
            return idle
        queue = run.local_queue
        return new_node_load(
            self._local_ids[i], self.home, _PREFILL, len(queue), sum(r.num_tokens for r in queue),
            1, 0, 0, False, True, self._clock.now,
        )  # fmt: skip

    def _pool_load(self) -> NodeLoad:
        run = self._run
        figures = (run.pool_in_flight, run.pool_in_flight_tokens)
        load = self._pool
        if load is None or figures != self._pool_figures:
            load = new_node_load(
                self.pool_node, self.pool, _PREFILL, figures[0], figures[1], 0, 0, 0, False,
                True, self._clock.now,
            )  # fmt: skip
            self._pool, self._pool_figures = load, figures
        return load
