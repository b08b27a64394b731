"""The event queue and its vocabulary: ``EventKind`` (whose value *is* the priority at equal
times), one frozen payload type per kind, and the heap ordered by ``(time_s, kind, seq)``.

``seq`` comes from a per-run counter, so two events at the same time and of the same kind pop in
the order they were scheduled: runs are deterministic whatever the payloads. At equal times,
capacity changes apply before transfers complete, completions before new arrivals (so a slot
freed at ``t`` is visible to an arrival at ``t``), and probes/samples last.

Payloads are ``NamedTuple``s rather than frozen dataclasses: as immutable and as typed, and
built at tuple speed (a run creates one per flow reschedule and per decode span). Pure.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum
from typing import NamedTuple

from prfaas.sim.link import Flow
from prfaas.sim.nodes import DecodeNode, PrefillNode, SimNode
from prfaas.sim.request import SimRequest


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


class CapacityChange(NamedTuple):
    """CAPACITY: the link between two sites (both directions) changes capacity."""

    site_a: int
    site_b: int
    gbps: float


class FlowDone(NamedTuple):
    """FLOW_DONE: ``flow`` ends now if it still has ``version`` (else it was rescheduled)."""

    flow: Flow
    version: int


class Handoff(NamedTuple):
    """A request handed from its prefill to its decode node (chosen at batch start). KV_ARRIVE
    carries it; so does the KV flow of a cross-site transfer."""

    req: SimRequest
    decode_node: DecodeNode


class CacheMove(NamedTuple):
    """The payload of a flow moving a cached prefix to ``dst_site`` before ``req``'s prefill."""

    req: SimRequest
    prefill_node: PrefillNode
    dst_site: int


class PrefillDone(NamedTuple):
    """PREFILL_DONE: ``node`` finished the batch ``batch``."""

    node: PrefillNode
    batch: tuple[Handoff, ...]


class DecodeTick(NamedTuple):
    """DECODE_TICK: ``node``'s next member finishes, if the node's span still has ``version``."""

    node: DecodeNode
    version: int


class Arrival(NamedTuple):
    """ARRIVAL: ``req`` arrives at its home site's gateway."""

    req: SimRequest


class Convert(NamedTuple):
    """CONVERT: the drained ``node`` comes back in the other role."""

    node: SimNode


Payload = CapacityChange | FlowDone | PrefillDone | Handoff | DecodeTick | Convert | Arrival | None
"""CONTROL, SAMPLE and PROBE carry nothing (``None``)."""

PAYLOAD_TYPES: dict[EventKind, type[object] | None] = {
    EventKind.CAPACITY: CapacityChange,
    EventKind.FLOW_DONE: FlowDone,
    EventKind.PREFILL_DONE: PrefillDone,
    EventKind.KV_ARRIVE: Handoff,
    EventKind.DECODE_TICK: DecodeTick,
    EventKind.CONVERT: Convert,
    EventKind.ARRIVAL: Arrival,
    EventKind.CONTROL: None,
    EventKind.SAMPLE: None,
    EventKind.PROBE: None,
}
"""The payload each kind carries (``tests/unit/sim`` checks every scheduled event against it)."""

Event = tuple[float, EventKind, int, Payload]


class EventQueue:
    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[Event] = []
        self.seq = itertools.count()
        """The per-run tie-breaker (public: the hot paths push with ``heapq`` directly)."""

    def push(self, time_s: float, kind: EventKind, payload: Payload = None) -> None:
        heapq.heappush(self.heap, (time_s, kind, next(self.seq), payload))

    def pop(self) -> Event:
        return heapq.heappop(self.heap)

    def __len__(self) -> int:
        return len(self.heap)

    def peek_time(self) -> float:
        return self.heap[0][0] if self.heap else float("inf")
