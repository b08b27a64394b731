"""The event queue and its vocabulary: ``EventKind`` (whose value *is* the priority at equal
times), one frozen event type per kind, and the heap ordered by ``(time_s, kind, seq)``.

Each heap entry *is* its event: a plain tuple ``(time_s, kind, seq, ...)`` whose other items are
what the handler needs, typed per kind by an alias below (``FlowDone``, ``DecodeTick``, ...) that
names the items; mypy checks every push against the heap's ``Event`` union and every handler
unpacks its own kind. Plain tuples, not ``NamedTuple`` classes: a tuple subclass costs 150-250 ns
more per event to build and free (no free list, a second tuple to construct it from), and with
~6 events per request that was the largest single cost the typed events added (measured with
``bench/sim_speed.py --before``; see docs/simulation.md, Speed). Tuples compare item by item and
``seq`` is unique, so ordering never reaches the payload items. ``seq`` comes from a per-run
counter, so two events at the same time and of the same kind pop in the order they were
scheduled: runs are deterministic whatever the payloads. At equal times, capacity changes apply
before transfers complete, completions before new arrivals (so a slot freed at ``t`` is visible
to an arrival at ``t``), and probes/samples last.

The two flow payloads (``Handoff``, ``CacheMove``) stay ``NamedTuple`` classes: a flow's handler
tells them apart by type, and there is one per request, not one per event. ``tests/unit/sim``
checks every item of every scheduled event against its alias. Pure.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum
from typing import NamedTuple

from prfaas.sim.link import Flow
from prfaas.sim.nodes import DecodeNode, PrefillNode, SimNode
from prfaas.sim.request import SimRequest

new_payload = tuple.__new__
"""``new_payload(Handoff, (req, node))``: a payload built at C speed (once per request)."""


class EventKind(IntEnum):
    """What an event does; the value orders events due at the same time (lower first)."""

    CAPACITY = 0
    FLOW_DONE = 1
    PREFILL_DONE = 2
    KV_ARRIVE = 3
    DECODE_TICK = 4
    CONVERT = 5
    ARRIVAL = 6
    CONTROL = 7
    SAMPLE = 8
    PROBE = 9


class Handoff(NamedTuple):
    """A request handed from its prefill to its decode node (chosen at routing time): the payload
    of a cross-site KV flow and a member of a ``PrefillDone`` batch. Not an event."""

    req: SimRequest
    decode_node: DecodeNode


class CacheMove(NamedTuple):
    """The payload of a flow moving a cached prefix to ``dst_site`` before ``req``'s prefill.
    Not an event."""

    req: SimRequest
    prefill_node: PrefillNode
    dst_site: int


CapacityChange = tuple[float, EventKind, int, int, int, float]
"""CAPACITY ``(time_s, kind, seq, site_a, site_b, gbps)``: the link between two sites (both
directions) changes capacity."""

FlowDone = tuple[float, EventKind, int, Flow, int]
"""FLOW_DONE ``(time_s, kind, seq, flow, version)``: ``flow`` ends now if it still has
``version`` (else it was rescheduled)."""

PrefillDone = tuple[float, EventKind, int, PrefillNode, tuple[Handoff, ...]]
"""PREFILL_DONE ``(time_s, kind, seq, node, batch)``: ``node`` finished the batch ``batch``."""

KvArrive = tuple[float, EventKind, int, SimRequest, DecodeNode]
"""KV_ARRIVE ``(time_s, kind, seq, req, decode_node)``: ``req``'s KV is whole at
``decode_node`` (its first token: TTFT). Ends with a ``Handoff``'s two items."""

DecodeTick = tuple[float, EventKind, int, DecodeNode, int]
"""DECODE_TICK ``(time_s, kind, seq, node, version)``: ``node``'s next member finishes, if the
node's span still has ``version``."""

Convert = tuple[float, EventKind, int, SimNode]
"""CONVERT ``(time_s, kind, seq, node)``: the drained ``node`` comes back in the other role."""

Arrival = tuple[float, EventKind, int, SimRequest]
"""ARRIVAL ``(time_s, kind, seq, req)``: ``req`` arrives at its home site's gateway."""

Timer = tuple[float, EventKind, int]
"""CONTROL, SAMPLE and PROBE ``(time_s, kind, seq)``: due at ``time_s``, carrying nothing else."""

Event = CapacityChange | FlowDone | PrefillDone | KvArrive | DecodeTick | Convert | Arrival | Timer

EVENT_TYPES: dict[EventKind, object] = {
    EventKind.CAPACITY: CapacityChange,
    EventKind.FLOW_DONE: FlowDone,
    EventKind.PREFILL_DONE: PrefillDone,
    EventKind.KV_ARRIVE: KvArrive,
    EventKind.DECODE_TICK: DecodeTick,
    EventKind.CONVERT: Convert,
    EventKind.ARRIVAL: Arrival,
    EventKind.CONTROL: Timer,
    EventKind.SAMPLE: Timer,
    EventKind.PROBE: Timer,
}
"""The event type (alias) of each kind (``tests/unit/sim`` checks every scheduled event
against it)."""


class EventQueue:
    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[Event] = []
        self.seq = itertools.count()
        """The per-run tie-breaker (public: the hot paths push with ``heapq`` directly)."""

    def push(self, event: Event) -> None:
        heapq.heappush(self.heap, event)

    def timer(self, time_s: float, kind: EventKind) -> None:
        """Schedule a CONTROL, SAMPLE or PROBE event."""
        heapq.heappush(self.heap, (time_s, kind, next(self.seq)))

    def next_seq(self) -> int:
        return next(self.seq)

    def pop(self) -> Event:
        return heapq.heappop(self.heap)

    def __len__(self) -> int:
        return len(self.heap)

    def peek_time(self) -> float:
        return self.heap[0][0] if self.heap else float("inf")
