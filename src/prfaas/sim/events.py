"""The event queue: a binary heap ordered by ``(time_s, kind priority, seq)``.

``seq`` comes from a per-run counter, so two events at the same time and of the same kind pop in
the order they were scheduled: runs are deterministic whatever the payloads. Kinds are small ints
whose value *is* the priority at equal times: capacity changes apply before transfers complete,
completions before new arrivals (so a slot freed at ``t`` is visible to an arrival at ``t``),
and probes/samples last. Pure.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

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

KIND_NAMES = {
    CAPACITY: "capacity",
    FLOW_DONE: "flow_done",
    PREFILL_DONE: "prefill_done",
    KV_ARRIVE: "kv_arrive",
    DECODE_TICK: "decode_tick",
    CONVERT: "convert",
    ARRIVAL: "arrival",
    CONTROL: "control",
    SAMPLE: "sample",
    PROBE: "probe",
}


class EventQueue:
    __slots__ = ("_seq", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = itertools.count()

    def push(self, time_s: float, kind: int, a: Any = None, b: Any = None) -> None:
        heapq.heappush(self.heap, (time_s, kind, next(self._seq), a, b))

    def pop(self) -> tuple[float, int, int, Any, Any]:
        return heapq.heappop(self.heap)

    def __len__(self) -> int:
        return len(self.heap)

    def peek_time(self) -> float:
        return self.heap[0][0] if self.heap else float("inf")
