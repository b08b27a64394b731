"""The event queue and its vocabulary: ``EventKind`` (whose value *is* the priority at equal
times), one frozen event type per kind, and the heap ordered by ``(time_s, kind, seq)``.

Each heap entry *is* its typed event: a ``NamedTuple`` whose first three fields are
``time_s, kind, seq`` and whose other fields are what the handler needs. Tuples compare field by
field and ``seq`` is unique, so ordering never reaches the payload fields; one object per event
(not a tuple wrapping a payload) is what keeps the typed events as cheap as the untyped tuples
they replaced. ``seq`` comes from a per-run counter, so two events at the same time and of the
same kind pop in the order they were scheduled: runs are deterministic whatever the payloads. At
equal times, capacity changes apply before transfers complete, completions before new arrivals
(so a slot freed at ``t`` is visible to an arrival at ``t``), and probes/samples last.

Construction: cold paths call the class (fields checked by mypy); the hot paths (one event per
flow reschedule, decode span, batch, arrival) build with ``new_event(Cls, (fields...))``, which is
``tuple.__new__``: the same object without the Python-level ``__new__`` call a ``NamedTuple``
constructor costs (about 140 ns of the ~5 us an event takes). ``tests/unit/sim`` checks every
field of every scheduled event against its annotation. Pure.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum
from typing import NamedTuple

from prfaas.sim.link import Flow
from prfaas.sim.nodes import DecodeNode, PrefillNode, SimNode
from prfaas.sim.request import SimRequest

new_event = tuple.__new__
"""``new_event(Cls, (time_s, kind, seq, ...))``: an event built at C speed (hot paths)."""


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
    """A request handed from its prefill to its decode node (chosen at batch start): the payload
    of a cross-site KV flow and a member of a ``PrefillDone`` batch. Not an event."""

    req: SimRequest
    decode_node: DecodeNode


class CacheMove(NamedTuple):
    """The payload of a flow moving a cached prefix to ``dst_site`` before ``req``'s prefill.
    Not an event."""

    req: SimRequest
    prefill_node: PrefillNode
    dst_site: int


class CapacityChange(NamedTuple):
    """CAPACITY: the link between two sites (both directions) changes capacity."""

    time_s: float
    kind: EventKind
    seq: int
    site_a: int
    site_b: int
    gbps: float


class FlowDone(NamedTuple):
    """FLOW_DONE: ``flow`` ends now if it still has ``version`` (else it was rescheduled)."""

    time_s: float
    kind: EventKind
    seq: int
    flow: Flow
    version: int


class PrefillDone(NamedTuple):
    """PREFILL_DONE: ``node`` finished the batch ``batch``."""

    time_s: float
    kind: EventKind
    seq: int
    node: PrefillNode
    batch: tuple[Handoff, ...]


class KvArrive(NamedTuple):
    """KV_ARRIVE: ``req``'s KV is whole at ``decode_node`` (its first token: TTFT)."""

    time_s: float
    kind: EventKind
    seq: int
    req: SimRequest
    decode_node: DecodeNode


class DecodeTick(NamedTuple):
    """DECODE_TICK: ``node``'s next member finishes, if the node's span still has ``version``."""

    time_s: float
    kind: EventKind
    seq: int
    node: DecodeNode
    version: int


class Convert(NamedTuple):
    """CONVERT: the drained ``node`` comes back in the other role."""

    time_s: float
    kind: EventKind
    seq: int
    node: SimNode


class Arrival(NamedTuple):
    """ARRIVAL: ``req`` arrives at its home site's gateway."""

    time_s: float
    kind: EventKind
    seq: int
    req: SimRequest


class Timer(NamedTuple):
    """CONTROL, SAMPLE and PROBE: due at ``time_s``, carrying nothing else."""

    time_s: float
    kind: EventKind
    seq: int


Event = CapacityChange | FlowDone | PrefillDone | KvArrive | DecodeTick | Convert | Arrival | Timer

EVENT_TYPES: dict[EventKind, type[Event]] = {
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
"""The event type of each kind (``tests/unit/sim`` checks every scheduled event against it)."""


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
        heapq.heappush(self.heap, Timer(time_s, kind, next(self.seq)))

    def next_seq(self) -> int:
        return next(self.seq)

    def pop(self) -> Event:
        return heapq.heappop(self.heap)

    def __len__(self) -> int:
        return len(self.heap)

    def peek_time(self) -> float:
        return self.heap[0][0] if self.heap else float("inf")
