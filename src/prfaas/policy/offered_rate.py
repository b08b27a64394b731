"""``OfferedRate``: the uncached prompt tokens per second offered to an elastic pool, over a sliding
window - what the autoscaler reads as ``GroupObservation.offered_tokens_per_s``. The elastic
simulator (``sim/elastic``) and the live observer (``serve/elastic/observe.py``) both measure it
with this object, so the same arrivals read the same rate in both.

Early on (less than a window since the origin) the rate is over the time elapsed, but never over
less than ``min_span_s`` (one autoscaler tick: a first prompt is not read as an infinite rate).
Pure: no clock (``now_s`` is passed in), no I/O; must not import serve, sim, torch or asyncio.
"""

from __future__ import annotations

from collections import deque


class OfferedRate:
    def __init__(self, window_s: float, min_span_s: float, origin_s: float = 0.0) -> None:
        if not window_s > 0 or not min_span_s > 0:
            raise ValueError(f"window_s ({window_s}) and min_span_s ({min_span_s}) must be > 0")
        self.window_s = window_s
        self.min_span_s = min_span_s
        self.origin_s = origin_s
        self._seen: deque[tuple[float, int]] = deque()
        self._tokens = 0

    def add(self, at_s: float, num_tokens: int) -> None:
        """``num_tokens`` offered at ``at_s`` (not before the last one added)."""
        self._seen.append((at_s, num_tokens))
        self._tokens += num_tokens

    def per_s(self, now_s: float) -> float:
        """Tokens per second offered over the last window (forgets what fell out of it)."""
        while self._seen and self._seen[0][0] < now_s - self.window_s:
            self._tokens -= self._seen.popleft()[1]
        span = min(self.window_s, max(now_s - self.origin_s, self.min_span_s))
        return self._tokens / span
