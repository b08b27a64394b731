"""Simulated nodes: a prefill node (FIFO queue, token-budget batches, cost-model service times) and
a decode node (continuous batching whose completion times are computed between membership
changes, so a request costs O(1) events whatever its output length); ``PoolIndex``: the
least-loaded node of a (site, role) pool (a scan of a small pool's keys, a lazy heap for a large
one: O(log n)); and ``Pools``: the one index of
every pool, by site and role.

State only; the simulator's stages (``simulator.py``, ``decode.py``, ``control.py``) move
requests between them. Pure.
"""

from __future__ import annotations

import heapq
import operator
from collections import deque
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from prfaas.core.ids import NodeId, SiteId
from prfaas.core.topology import NodeRole
from prfaas.core.views import NodeLoad, new_node_load
from prfaas.perf import CostModel
from prfaas.sim.request import SimRequest


class NodeBase:
    """What prefill and decode nodes share; a node is a ``SimNode`` (one of the two)."""

    __slots__ = ("busy_s", "cached_load", "cm", "draining", "heap_key", "index", "node_id",
                 "per_request_s", "role", "site", "site_id")  # fmt: skip

    def __init__(
        self, node_id: NodeId, index: int, site: int, site_id: SiteId, role: NodeRole,
        cm: CostModel,
    ) -> None:  # fmt: skip
        self.node_id = node_id
        self.index = index
        self.site = site
        self.site_id = site_id
        self.role = role
        self.cm = cm
        self.draining = False
        self.heap_key: float = 0.0
        """The load key last pushed to the pool's heap (entries with another key are stale)."""
        self.cached_load: NodeLoad | None = None
        """The last ``NodeLoad`` built; the simulator clears it whenever the node changes."""
        self.busy_s = 0.0
        """Seconds spent working (prefill) or with a non-empty batch (decode)."""
        self.per_request_s = (
            cm.plumbing.prefill_per_request_s if role is NodeRole.PREFILL
            else cm.plumbing.decode_per_request_s
        )  # fmt: skip
        """The node process's fixed cost per request it serves (``sim.plumbing``)."""


class PrefillNode(NodeBase):
    __slots__ = ("batch", "batch_end_s", "batch_factor", "batch_left_s", "batch_mark_s",
                 "batch_retimable", "busy", "free_at_s", "queue",
                 "queued_tokens", "step_fixed_s")  # fmt: skip

    def __init__(self, node_id: NodeId, index: int, site: int, site_id: SiteId, cm: CostModel):
        super().__init__(node_id, index, site, site_id, NodeRole.PREFILL, cm)
        self.step_fixed_s = cm.decode_step_fixed_s()
        """What a batch of prefills pays once (``CostModel.batched_prefill_s``; 0 from profiles
        without a measured decode fit: the sum then)."""
        self.queue: deque[SimRequest] = deque()
        self.busy = False
        self.free_at_s = 0.0
        """When all work assigned so far ends (FIFO, sum-of-service batches): the load key."""
        self.queued_tokens = 0
        # The batch computing now, for re-timing it when its site's shared cores get busier or
        # freer (``Simulator._retime_prefills``): its handoffs (its PREFILL_DONE event's
        # identity), when it ends, its slowdown, its own-speed work left at ``batch_mark_s``.
        self.batch: tuple[Any, ...] = ()
        """(``sim.events.Handoff`` s: not named here, events.py imports this module.)"""
        self.batch_end_s = 0.0
        self.batch_factor = 1.0
        self.batch_left_s = 0.0
        self.batch_mark_s = 0.0
        self.batch_retimable = False
        """Only a batch whose KV stays on its site: a cross-site one paces its link flow."""

    def is_idle(self) -> bool:
        return not self.busy and not self.queue

    def shares_cores(self, work_s: float, factor: float, now: float, retimable: bool) -> None:
        """The batch just started (``batch``, ``batch_end_s`` set) runs on shared cores: its
        own-speed work, its slowdown, whether it may be re-timed."""
        self.batch_left_s, self.batch_factor, self.batch_mark_s = work_s, factor, now
        self.batch_retimable = retimable

    def retime(self, now: float, factor: float) -> float:
        """Go on at slowdown ``factor`` from ``now`` (processor sharing): the work left at the
        old speed, now at the new; returns the batch's new end (``busy_s`` follows it)."""
        left = self.batch_left_s - (now - self.batch_mark_s) / self.batch_factor
        left = left if left > 0.0 else 0.0
        end = now + left * factor
        self.busy_s += end - self.batch_end_s
        self.batch_left_s, self.batch_mark_s, self.batch_factor = left, now, factor
        self.batch_end_s = end
        return end

    def load_key(self) -> float:
        return self.free_at_s

    def load(self, now: float) -> NodeLoad:
        load = self.cached_load
        if load is None:
            load = self.cached_load = new_node_load(
                self.node_id, self.site_id, self.role, len(self.queue), self.queued_tokens,
                1 if self.busy else 0, 0, 0, self.draining, True, now,
            )  # fmt: skip
        return load


class DecodeNode(NodeBase):
    __slots__ = ("ctx_sum", "ctx_tops", "first_token_wait_per_decoding_s", "first_token_wait_s",
                 "first_token_waits", "install_per_byte_s", "installs", "kv_capacity", "kv_used",
                 "max_batch", "members", "pads_batch", "reserved", "seq", "slot_s", "span_batch",
                 "span_ctx", "span_factor", "span_start_s", "step", "tick_s", "tick_steps",
                 "tick_version", "waiting", "work_s")  # fmt: skip

    def __init__(
        self, node_id: NodeId, index: int, site: int, site_id: SiteId, cm: CostModel,
        max_batch: int, kv_capacity: int, pads_batch: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(node_id, index, site, site_id, NodeRole.DECODE, cm)
        self.pads_batch = pads_batch
        """The engine pads its batch to the longest member's context
        (``SimSite.decode_pads_batch``): a step's context terms are paid on ``batch x longest``,
        not on the contexts' sum."""
        self.ctx_tops: list[tuple[int, int, SimRequest]] = []
        """With ``pads_batch``: a max-heap (negated) of members' ``context`` shares; finished
        members leave it lazily, when they reach its top."""
        self.max_batch = max_batch
        self.kv_capacity = kv_capacity
        self.kv_used = 0
        self.members: list[tuple[int, int, SimRequest]] = []
        """Heap of (finish step, join order, request)."""
        self.step = 0
        """Decode steps this node has completed (at the start of the current span)."""
        self.seq = 0
        self.slot_s = 0.0
        """Integral of batch size over time (slot-seconds used)."""
        self.work_s = 0.0
        """Of ``busy_s``, the node's own work: its steps and installs at its own speed (on
        shared cores ``busy_s`` is that work stretched by the sharing); booked where a span
        ends, beside ``busy_s``."""
        self.waiting: deque[SimRequest] = deque()
        """KV arrived, no slot or memory yet."""
        self.reserved = 0
        """Requests routed here whose KV has not arrived."""
        self.ctx_sum = 0
        self.span_start_s = 0.0
        self.span_factor = 1.0
        """The span's slowdown on cores shared with the site's other nodes (1: its own)."""
        self.span_batch = 0
        self.span_ctx = 0
        self.tick_s = float("inf")
        self.tick_steps = 0
        self.tick_version = 0
        self.install_per_byte_s = cm.plumbing.decode_per_kv_byte_s
        """Receiving, verifying and installing one KV byte (``sim.plumbing``)."""
        self.installs = self.per_request_s > 0 or self.install_per_byte_s > 0
        """Taking a request in costs this node time (one test on the hot path)."""
        self.first_token_wait_s = cm.plumbing.first_token_wait_s
        """A first token's wait here with nothing decoding (``sim.plumbing``): TTFT only."""
        self.first_token_wait_per_decoding_s = cm.plumbing.first_token_wait_per_decoding_s
        """A first token's wait per request decoding here (``sim.plumbing``): TTFT only."""
        self.first_token_waits = (
            self.first_token_wait_s > 0 or self.first_token_wait_per_decoding_s > 0
        )
        """A first token waits here (one test on the hot path)."""

    def is_idle(self) -> bool:
        return not (self.members or self.waiting or self.reserved)

    def load_key(self) -> int:
        return len(self.members) + len(self.waiting) + self.reserved

    def load(self, now: float) -> NodeLoad:
        load = self.cached_load
        if load is None:
            load = self.cached_load = new_node_load(
                self.node_id, self.site_id, self.role, len(self.waiting) + self.reserved, 0,
                len(self.members), self.kv_used, self.kv_capacity, self.draining, True, now,
            )  # fmt: skip
        return load


SimNode = PrefillNode | DecodeNode

N = TypeVar("N", PrefillNode, DecodeNode)
_heappush = heapq.heappush  # module-level: no attribute lookup per push (several per request)
_heappop = heapq.heappop
_heapreplace = heapq.heapreplace


_SCAN_MAX = 16
"""Pools of at most this many members answer ``best`` by a scan, larger ones from a heap: a
site's few nodes (the paper's 3 prefill and 5 decode) cost a heap a sift per routing decision
and a fix-up per grown load (1-1.5 us a request, twice), a scan of their keys in C ~0.3 us."""
_heap_key_of = operator.attrgetter("heap_key")


class PoolIndex(Generic[N]):
    """Least-loaded accepting node of one pool: the least (key, node index) among the members
    not draining, ``node.heap_key`` being the node's key as of its last ``touch`` (the simulator
    touches a node whenever its load changes).

    A small pool (``_SCAN_MAX``) scans its accepting members, kept in index order. A larger one
    keeps a heap of (load key, node index, node), lazily: each accepting member has at least
    one entry at or below its key. A load that falls pushes an entry at the new key; one that
    grows pushes nothing: the node's entry, now too low, is moved down to the node's key when
    it reaches the top (``best``), and an entry above the key (left behind by a fall) is dropped
    there. ``best`` returns an entry whose key is the node's, below or equal to every other
    member's lowest entry and so to its key: the least (key, index), as an eager heap gives. A
    prefill node's key (``free_at_s``) only grows: its touch never pushes, and a routing
    decision costs one sift where an eager heap paid a push and a pop of the stale entry.
    Draining (``ControlLoop.drain``) sets the node's flag alone: both forms skip such a node
    when they meet it.
    """

    __slots__ = ("_heap", "_max_entries", "_scan", "members")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, N]] = []
        self.members: dict[int, N] = {}
        self._max_entries = 64
        """Heap entries (live and stale) past which the heap is rebuilt: ``4 x members + 64``,
        kept with the membership (``touch`` runs a few times per request)."""
        self._scan: list[N] | None = []
        """A small pool's accepting members in index order (``None``: the heap answers)."""

    def add(self, node: N) -> None:
        self.members[node.index] = node
        self._max_entries = 4 * len(self.members) + 64
        node.cached_load = None
        key = node.heap_key = node.load_key()
        if self._scan is None:
            _heappush(self._heap, (key, node.index, node))
        else:  # the scan list again, or the heap if the pool outgrew it
            self._membership_changed()

    def remove(self, node: N) -> None:
        self.members.pop(node.index, None)
        self._max_entries = 4 * len(self.members) + 64
        if self._scan is not None or len(self.members) <= _SCAN_MAX:
            self._membership_changed()

    def _membership_changed(self) -> None:
        """Scan or heap for the new size (rebuilt whole: membership changes are rare)."""
        if len(self.members) <= _SCAN_MAX:
            self._heap = []
            self._scan = sorted(
                (n for n in self.members.values() if not n.draining), key=lambda n: n.index
            )
        else:
            self._scan = None
            self._rebuild()

    def touch(self, node: N) -> None:
        """``node``'s load changed (or may have). Only a fall pushes an entry (see the class)."""
        node.cached_load = None
        key = node.load_key()
        if key < node.heap_key and self._scan is None:
            heap = self._heap
            _heappush(heap, (key, node.index, node))
            if len(heap) > self._max_entries:
                node.heap_key = key
                self._rebuild()
        node.heap_key = key

    def _rebuild(self) -> None:
        self._heap = []
        for n in self.members.values():
            if not n.draining:
                n.heap_key = n.load_key()
                self._heap.append((n.heap_key, n.index, n))
        heapq.heapify(self._heap)

    def best(self) -> N | None:
        scan = self._scan
        if scan is not None:
            if not scan:
                return None
            # ``min`` keeps the first of equal keys: in index order, the least (key, index).
            found = min(scan, key=_heap_key_of)
            if found.draining:  # drained since the list was made: drop every such node
                self._scan = [n for n in scan if not n.draining]
                return self.best()
            return found
        heap = self._heap
        members = self.members
        while heap:
            key, index, node = heap[0]
            if node.draining or members.get(index) is not node:
                _heappop(heap)  # takes no work (any more)
            elif key == node.heap_key:
                return node
            elif key < node.heap_key:  # the node's load grew since: its entry moves down
                _heapreplace(heap, (node.heap_key, index, node))
            else:  # left behind when the load fell (a lower entry exists)
                _heappop(heap)
        if any(not n.draining for n in members.values()):
            self._rebuild()
            return self.best()
        return None

    def __len__(self) -> int:
        return len(self.members)


class Pools:
    """Every pool of a run, indexed by site number: ``prefill[site]`` and ``decode[site]`` exist
    for every site (empty where a site has none, so no lookup returns ``None``)."""

    __slots__ = ("decode", "prefill")

    def __init__(self, num_sites: int) -> None:
        self.prefill: list[PoolIndex[PrefillNode]] = [PoolIndex() for _ in range(num_sites)]
        self.decode: list[PoolIndex[DecodeNode]] = [PoolIndex() for _ in range(num_sites)]

    def add(self, node: SimNode) -> None:
        if isinstance(node, PrefillNode):
            self.prefill[node.site].add(node)
        else:
            self.decode[node.site].add(node)

    def remove(self, node: SimNode) -> None:
        if isinstance(node, PrefillNode):
            self.prefill[node.site].remove(node)
        else:
            self.decode[node.site].remove(node)

    def __iter__(self) -> Iterator[tuple[int, NodeRole, list[SimNode]]]:
        """``(site, role, members)`` for every non-empty pool, prefill pools first per site."""
        for site, (pre, dec) in enumerate(zip(self.prefill, self.decode, strict=True)):
            if pre.members:
                yield site, NodeRole.PREFILL, list(pre.members.values())
            if dec.members:
                yield site, NodeRole.DECODE, list(dec.members.values())
