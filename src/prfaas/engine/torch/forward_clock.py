"""``ForwardClock``: the CPU seconds an engine thread spends inside its model's forward passes,
the layer hand-out inside them excluded: the work a profile's prefill and decode curves price
(``commands.profile_passes.PassTimer`` times the same ``hf_cache.forward`` calls, with no hooks
armed).

A node reports it (``forward_cpu_s``) beside its process's whole CPU, so ``prfaas profile``
reads what a live request costs beyond the curve on the same requests, at the same moment
(``commands.profile_plumbing``), not against passes timed at another moment: the machine's speed
between two moments moved those readings 30-70% (docs/fidelity.md, the twenty-seventh round).

``time.thread_time``: the calling thread's own CPU, so with more than one torch intra-op thread
the other threads' share of a pass is not in it. One thread only (the engine thread) may use a
clock; nothing here locks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class ForwardClock:
    def __init__(self) -> None:
        self._total_s = 0.0
        self._paused_s = 0.0

    @property
    def total_s(self) -> float:
        """CPU seconds counted so far (a float read from another thread is whole under the GIL)."""
        return self._total_s

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Count this thread's CPU while the block runs, less what ``paused`` blocks inside it
        took (counted even when the block raises: the CPU was spent)."""
        paused_at, started = self._paused_s, time.thread_time()
        try:
            yield
        finally:
            self._total_s += time.thread_time() - started - (self._paused_s - paused_at)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the block's CPU out of the ``timing`` block it runs inside (a hand-out hook)."""
        started = time.thread_time()
        try:
            yield
        finally:
            self._paused_s += time.thread_time() - started
