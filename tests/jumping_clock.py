"""An asyncio event loop whose clock jumps to the next timer instead of sleeping.

For tests of timed code (the ``timed`` engine, the sender's pacing): every ``asyncio.sleep`` and
timeout completes at once with the loop's clock moved exactly by it, so concurrent tasks
interleave in the order the wall clock would give them, with no wall time spent and no timing
in the assertions. A loop with nothing ready and no timer is a deadlock and raises.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Coroutine
from typing import Any


class JumpingSelector(selectors.DefaultSelector):
    """Never sleeps: when nothing is ready, the loop's clock jumps by the timeout asked for."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready:
            if timeout is None:
                raise RuntimeError("deadlock: nothing ready and no timer")
            now = self._loop.virtual_s
            # Always forward: a timeout below the clock's resolution still moves it one ulp
            # (a clock read through an offset could otherwise wait for ever).
            self._loop.virtual_s = max(now + timeout, math.nextafter(now, math.inf))
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector loop whose ``time()`` is ``virtual_s``, moved only by ``JumpingSelector``."""

    def __init__(self) -> None:
        self.virtual_s = 0.0
        super().__init__(JumpingSelector(self))

    def time(self) -> float:
        return self.virtual_s


def run_virtual(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` to completion on a fresh ``VirtualTimeLoop`` (closed afterwards)."""
    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(coro)
    finally:
        loop.close()
