"""Waiting for a time on an injected clock: the only place the timed engine touches asyncio time.

``LoopWaiter`` sleeps on the event loop until a ``Clock`` (normally ``LoopClock``, which reads the
loop's own monotonic time source) reaches the deadline; ``VirtualWaiter`` just moves a
``VirtualClock`` there, so tests of the timed engine are exact and take no wall time.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from prfaas.core.clock import Clock, VirtualClock


class Waiter(Protocol):
    clock: Clock

    async def wait_until(self, t_s: float) -> None:
        """Return once ``clock.now() >= t_s``."""
        ...


class LoopWaiter:
    __slots__ = ("clock",)

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def wait_until(self, t_s: float) -> None:
        while (remaining := t_s - self.clock.now()) > 0:
            await asyncio.sleep(remaining)


class VirtualWaiter:
    __slots__ = ("clock",)

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    async def wait_until(self, t_s: float) -> None:
        if t_s > self.clock.now():
            self.clock.advance_to(t_s)
        await asyncio.sleep(0)  # still a scheduling point, like a real wait
