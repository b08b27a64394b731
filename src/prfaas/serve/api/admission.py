"""Bounded admission: at most ``max_in_flight`` requests hold a slot, at most ``max_queued`` wait.

A request that finds the queue full, or waits longer than its timeout, is refused (``Overloaded``)
before anything reaches the backend. Slots are handed over FIFO. Single event loop; no locks.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Overloaded(Exception):
    """No slot and no room (or no time) to wait for one; ``reason`` says which."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        """"queue_full" or "queue_timeout"."""


class Permit:
    """One admission slot; ``release()`` is idempotent so every exit path may call it."""

    __slots__ = ("_admission", "_released")

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release()


class Admission:
    def __init__(self, max_in_flight: int, max_queued: int) -> None:
        if max_in_flight < 1 or max_queued < 0:
            raise ValueError(
                f"need max_in_flight >= 1, max_queued >= 0; got {max_in_flight}, {max_queued}"
            )
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def num_in_flight(self) -> int:
        return self._in_flight

    @property
    def num_queued(self) -> int:
        return len(self._waiters)

    async def acquire(self, timeout_s: float) -> Permit:
        if self._in_flight < self.max_in_flight and not self._waiters:
            self._in_flight += 1
            return Permit(self)
        if len(self._waiters) >= self.max_queued:
            raise Overloaded(
                "queue_full", f"{self._in_flight} in flight and {len(self._waiters)} queued"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except BaseException as exc:
            # Timed out or cancelled; if the slot was handed to us meanwhile, pass it on.
            if waiter.done() and not waiter.cancelled():
                self._release()
            if isinstance(exc, TimeoutError):
                raise Overloaded("queue_timeout", f"no slot free within {timeout_s:g} s") from None
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return Permit(self)

    def _release(self) -> None:
        # Hand the slot straight to the oldest live waiter (in_flight unchanged), else free it.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._in_flight -= 1
