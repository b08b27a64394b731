"""``Signal`` and ``wait_until``: waiting on engine state with a timeout that restarts on progress.

Every wait in the engine goes through ``wait_until``: it returns when ``ready()`` holds, raises the
waiter's own error as soon as ``failed()`` returns one, and raises ``TimeoutError`` if the signal
did not fire for ``timeout_s`` (so a long transfer that keeps moving never times out, a stalled one
always does). asyncio only; no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Signal:
    """A broadcast 'something changed': waiters wake on every ``fire``."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self) -> None:
        await self._event.wait()


async def wait_until(
    signal: Signal,
    ready: Callable[[], bool],
    failed: Callable[[], BaseException | None],
    timeout_s: float,
    what: str,
) -> None:
    while True:
        err = failed()
        if err is not None:
            raise err
        if ready():
            return
        try:
            async with asyncio.timeout(timeout_s):
                await signal.wait()
        except TimeoutError:
            raise TimeoutError(f"no progress for {timeout_s:g} s waiting for {what}") from None
