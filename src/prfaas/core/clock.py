"""Clocks: where ``now`` comes from. Policies never read a clock; drivers pass ``now`` in.

``VirtualClock`` is advanced by the simulator or by tests; ``LoopClock`` reads a monotonic time
source (by default ``time.monotonic``, the same clock asyncio's event loop uses) so a live driver
and the cost-model timed engine can share one notion of time. No asyncio import here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock's own (monotonic) timeline."""
        ...


class VirtualClock:
    """A clock that only moves when told to; never goes backwards."""

    __slots__ = ("_now_s",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = float(start_s)

    def now(self) -> float:
        return self._now_s

    def advance_to(self, t_s: float) -> None:
        if t_s < self._now_s:
            raise ValueError(f"virtual clock cannot go back from {self._now_s} to {t_s}")
        self._now_s = float(t_s)

    def advance_by(self, dt_s: float) -> None:
        if dt_s < 0:
            raise ValueError(f"virtual clock cannot advance by a negative {dt_s}")
        self._now_s += dt_s


class LoopClock:
    """Real monotonic time, optionally sped up: ``now = origin + (source() - t0) * speed``.

    ``speed`` > 1 lets an emulated deployment run faster than the hardware it pretends to be.
    """

    __slots__ = ("_origin_s", "_source", "_speed", "_t0")

    def __init__(
        self,
        source: Callable[[], float] = time.monotonic,
        speed: float = 1.0,
        origin_s: float = 0.0,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"clock speed must be > 0, got {speed}")
        self._source = source
        self._speed = speed
        self._origin_s = origin_s
        self._t0 = source()

    def now(self) -> float:
        return self._origin_s + (self._source() - self._t0) * self._speed
