"""``TokenBucket``: pacing of one link's payload bytes to a rate, so KV can be held to a share.

Debt-based: ``reserve(n, now_s)`` always succeeds and returns how long the caller must wait before
sending, so a chunk larger than the burst still goes (it just waits longer) and concurrent writers
queue fairly in reservation order. Pure: the caller passes ``now_s`` and does the sleeping.

It also keeps ``throttled_s(now_s)``: the seconds during which it held bytes back (the bucket was
in debt, so a reserved chunk was waiting for tokens). While throttled the link's sender sends at
exactly the rate: such time is *link-limited*, not limited by what the producer offered, which is
what a capacity estimate needs to know (``core.link_estimate``). Imports nothing.
"""

from __future__ import annotations


class TokenBucket:
    def __init__(self, rate_bytes_per_s: float, burst_bytes: float, now_s: float) -> None:
        if rate_bytes_per_s <= 0 or burst_bytes <= 0:
            raise ValueError(f"rate {rate_bytes_per_s} and burst {burst_bytes} must be > 0")
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_bytes = burst_bytes
        self._tokens = burst_bytes
        self._at_s = now_s
        # Throttled time: closed debt spans, plus the open one [_debt_from_s, _debt_until_s).
        self._throttled_s = 0.0
        self._debt_from_s = now_s
        self._debt_until_s = now_s

    def _refill(self, now_s: float) -> None:
        if now_s > self._at_s:
            self._tokens = min(
                self.burst_bytes, self._tokens + (now_s - self._at_s) * self.rate_bytes_per_s
            )
            self._at_s = now_s

    def reserve(self, num_bytes: int, now_s: float) -> float:
        """Take ``num_bytes`` (possibly into debt); seconds to wait before sending them."""
        self._refill(now_s)
        self._tokens -= num_bytes
        wait_s = 0.0 if self._tokens >= 0 else -self._tokens / self.rate_bytes_per_s
        if wait_s > 0:
            self._note_debt(now_s, now_s + wait_s)
        return wait_s

    def set_rate(self, rate_bytes_per_s: float, now_s: float) -> None:
        if rate_bytes_per_s <= 0:
            raise ValueError(f"rate must be > 0, got {rate_bytes_per_s}")
        self._refill(now_s)
        self.rate_bytes_per_s = rate_bytes_per_s
        if self._tokens < 0:  # the debt now clears at the new rate
            self._debt_until_s = max(now_s, self._debt_from_s)
            self._note_debt(now_s, now_s - self._tokens / rate_bytes_per_s)

    def throttled_s(self, now_s: float) -> float:
        """Cumulative seconds up to ``now_s`` in which the bucket held reserved bytes back."""
        open_s = max(0.0, min(now_s, self._debt_until_s) - self._debt_from_s)
        return self._throttled_s + open_s

    def _note_debt(self, from_s: float, until_s: float) -> None:
        """The bucket is in debt over [from_s, until_s): merge it into the open span (debt spans
        only grow forward: a later reservation extends the debt it joins)."""
        if from_s > self._debt_until_s:  # the previous debt was paid off before this one
            self._throttled_s += self._debt_until_s - self._debt_from_s
            self._debt_from_s = from_s
        self._debt_until_s = max(self._debt_until_s, until_s)
