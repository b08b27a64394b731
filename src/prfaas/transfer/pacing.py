"""``TokenBucket``: pacing of one link's payload bytes to a rate, so KV can be held to a share;
``CappedPacer``: a destination link's bucket under a process-wide egress cap (a chunk waits for
both); ``Pacer``: what a ``transfer.Link`` needs of either.

Debt-based: ``reserve(n, now_s)`` always succeeds and returns how long the caller must wait before
sending, so a chunk larger than the burst still goes (it just waits longer) and concurrent writers
queue fairly in reservation order. Pure: the caller passes ``now_s`` and does the sleeping.

It also keeps ``throttled_s(now_s)``: the seconds during which it held bytes back (the bucket was
in debt, so a reserved chunk was waiting for tokens). While throttled the link's sender sends at
exactly the rate: such time is *link-limited*, not limited by what the producer offered, which is
what a capacity estimate needs to know (``core.link_estimate``). Imports nothing.
"""

from __future__ import annotations

from typing import Protocol

LINK_BURST_S = 0.01
"""A link's pacing burst, in seconds of its rate (``link_burst_bytes``)."""
MIN_LINK_BURST_BYTES = 16 << 10


def link_burst_bytes(rate_bytes_per_s: float) -> float:
    """The burst a link paces with: 10 ms of its rate, at least 16 KiB. Debt-based, a larger chunk
    still goes (after waiting); a burst of a whole chunk (1 MiB) would let every transfer under a
    chunk leave unpaced after idle (at 10 Mbit/s, 0.8 s of the rate for free)."""
    return max(MIN_LINK_BURST_BYTES, rate_bytes_per_s * LINK_BURST_S)


class Pacer(Protocol):
    """What a link's writers ask of their pacer."""

    @property
    def rate_bytes_per_s(self) -> float: ...

    def reserve(self, num_bytes: int, now_s: float) -> float: ...

    def throttled_s(self, now_s: float) -> float: ...


class _DebtSpans:
    """Cumulative seconds in debt: closed spans, plus the open one [from_s, until_s)."""

    __slots__ = ("closed_s", "from_s", "until_s")

    def __init__(self, now_s: float) -> None:
        self.closed_s = 0.0
        self.from_s = now_s
        self.until_s = now_s

    def note(self, from_s: float, until_s: float) -> None:
        """In debt over [from_s, until_s): merged into the open span (debt spans only grow
        forward: a later reservation extends the debt it joins)."""
        if from_s > self.until_s:  # the previous debt was paid off before this one
            self.closed_s += self.until_s - self.from_s
            self.from_s = from_s
        self.until_s = max(self.until_s, until_s)

    def total(self, now_s: float) -> float:
        return self.closed_s + max(0.0, min(now_s, self.until_s) - self.from_s)


class TokenBucket:
    def __init__(self, rate_bytes_per_s: float, burst_bytes: float, now_s: float) -> None:
        if rate_bytes_per_s <= 0 or burst_bytes <= 0:
            raise ValueError(f"rate {rate_bytes_per_s} and burst {burst_bytes} must be > 0")
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_bytes = burst_bytes
        self._tokens = burst_bytes
        self._at_s = now_s
        self._debt = _DebtSpans(now_s)

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
            self._debt.note(now_s, now_s + wait_s)
        return wait_s

    def set_rate(self, rate_bytes_per_s: float, burst_bytes: float, now_s: float) -> None:
        """A new rate and its burst from ``now_s``: tokens saved at the old rate beyond the new
        burst are dropped (a bucket re-rated from 10 Gbit/s to 8 Mbit/s would otherwise let its
        12.5 MB burst, 12 s of the new rate, leave unpaced)."""
        if rate_bytes_per_s <= 0 or burst_bytes <= 0:
            raise ValueError(f"rate {rate_bytes_per_s} and burst {burst_bytes} must be > 0")
        self._refill(now_s)
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_bytes = burst_bytes
        self._tokens = min(self._tokens, burst_bytes)
        if self._tokens < 0:  # the debt now clears at the new rate
            self._debt.until_s = max(now_s, self._debt.from_s)
            self._debt.note(now_s, now_s - self._tokens / rate_bytes_per_s)

    def throttled_s(self, now_s: float) -> float:
        """Cumulative seconds up to ``now_s`` in which the bucket held reserved bytes back."""
        return self._debt.total(now_s)


class CappedPacer:
    """A destination link's own bucket under the process's egress cap (one bucket every capped
    link shares): a chunk waits for whichever of the two is further in debt. Its throttled time
    is its own (the spans in which either held this link's chunks back), not the cap's: the cap
    in debt because of another link is not this link's limit until it makes this link wait."""

    def __init__(self, link: TokenBucket | None, cap: TokenBucket, now_s: float) -> None:
        self.link = link
        self.cap = cap
        self._debt = _DebtSpans(now_s)

    @property
    def rate_bytes_per_s(self) -> float:
        if self.link is None:
            return self.cap.rate_bytes_per_s
        return min(self.link.rate_bytes_per_s, self.cap.rate_bytes_per_s)

    def reserve(self, num_bytes: int, now_s: float) -> float:
        wait_s = self.cap.reserve(num_bytes, now_s)
        if self.link is not None:
            wait_s = max(wait_s, self.link.reserve(num_bytes, now_s))
        if wait_s > 0:
            self._debt.note(now_s, now_s + wait_s)
        return wait_s

    def throttled_s(self, now_s: float) -> float:
        return self._debt.total(now_s)
