"""``TokenBucket``: pacing of one link's payload bytes to a rate, so KV can be held to a share.

Debt-based: ``reserve(n, now_s)`` always succeeds and returns how long the caller must wait before
sending, so a chunk larger than the burst still goes (it just waits longer) and concurrent writers
queue fairly in reservation order. Pure: the caller passes ``now_s`` and does the sleeping.
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
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_bytes_per_s

    def set_rate(self, rate_bytes_per_s: float, now_s: float) -> None:
        if rate_bytes_per_s <= 0:
            raise ValueError(f"rate must be > 0, got {rate_bytes_per_s}")
        self._refill(now_s)
        self.rate_bytes_per_s = rate_bytes_per_s
