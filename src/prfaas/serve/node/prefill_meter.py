"""``PrefillMeter``: a prefill node's measured speed, as cumulative counters for its reports:
the uncached tokens it prefilled and the wall seconds it spent computing them.

Busy seconds are the union of the intervals in which at least one prefill was computing (from its
first layer handed out to its result), so prefills that overlap on one engine count once: the
ratio is the node's speed, the quantity the autoscaler divides demand by (``policy.autoscaler``;
the elastic simulator's is prefilled tokens over its nodes' compute seconds). Time spent queued
for the engine is not busy time. No I/O; the clock is passed in.
"""

from __future__ import annotations


class PrefillMeter:
    def __init__(self) -> None:
        self.prefilled_tokens = 0
        self._busy_s = 0.0
        self._computing = 0
        self._since_s = 0.0

    def started(self, now_s: float) -> None:
        """A prefill began computing."""
        if self._computing == 0:
            self._since_s = now_s
        self._computing += 1

    def ended(self, now_s: float, num_tokens: int) -> None:
        """A prefill that ``started`` stopped computing; ``num_tokens`` uncached tokens were
        prefilled (0 when it failed or was cancelled)."""
        if self._computing == 0:
            raise RuntimeError("a prefill ended that never started")
        self._computing -= 1
        if self._computing == 0:
            self._busy_s += max(0.0, now_s - self._since_s)
        self.prefilled_tokens += num_tokens

    def busy_s(self, now_s: float) -> float:
        """Busy seconds so far, the interval still open included."""
        if self._computing:
            return self._busy_s + max(0.0, now_s - self._since_s)
        return self._busy_s
