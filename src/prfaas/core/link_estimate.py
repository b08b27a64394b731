"""``CapacityEstimator``: an inter-site link's capacity estimated from what its senders observe.

The live ``LinkState.capacity_bytes_per_s`` must follow the link the KV really crosses, not the
rate the deployment file names: a link can lose capacity underneath a running deployment (a
shaper, a congested path, a failed member of a bond) without anyone telling prfaas.

Each ``observe(now_s, readings)`` takes, per connection set (one ``LinkReading`` per transfer link
of the sender: cumulative bytes the receiver acknowledged, the sender's queue now, its RTT), and
differentiates it against the previous call. Per interval:

- *goodput* = acknowledged bytes / seconds, summed over the links (a link that appeared in the
  interval counts from its first reading; one whose counter went backwards was replaced and
  counts from its new value);
- the interval is *busy* when the sender's queue (bytes accepted by ``send`` and not yet written,
  plus bytes written but not yet sent by TCP) held at least ``busy_queue_bytes`` at both ends: the
  sender had more to send than the link took, so the goodput is what the link gives.

The estimate is the highest busy goodput within the last ``window_s`` (a max filter, as BBR's
bottleneck-bandwidth filter: a busy interval measures the link or less, never more, so the max is
the tightest lower bound the window holds). An interval that was not busy says only that the link
carried at least that much: it enters the filter only when it is above the estimate (the link
proved faster than believed, e.g. after it recovered while the queue stayed empty). With nothing in
the window the last estimate is held: an idle link is not assumed to have changed.
Until the first sample enters the filter the estimate is the ``configured`` rate (basis
``"configured"``); from then on it is ``"measured"``.

Units are the caller's (bytes per second of whatever the readings count). Pure: no I/O, no clock
reads (``now_s`` is passed in); imports nothing outside the standard library.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Literal

CapacityBasis = Literal["configured", "measured"]


@dataclass(frozen=True, slots=True)
class LinkReading:
    """One transfer link's counters at one instant."""

    bytes_acked: int
    """Cumulative bytes the receiver acknowledged (TCP_INFO bytes_acked, or the link's own)."""
    queue_bytes: int
    """Bytes the sender holds that have not left yet: accepted by ``send`` and not written, plus
    written and not sent by TCP (``notsent_bytes``)."""
    rtt_s: float = 0.0
    """Smoothed RTT (0: unknown)."""


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    """The estimate after one observation."""

    capacity_bytes_per_s: float
    basis: CapacityBasis
    goodput_bytes_per_s: float = 0.0
    """Acknowledged bytes per second over the last interval."""
    busy: bool = False
    """The last interval was busy (its goodput measured the link)."""
    queue_bytes: int = 0
    """The sender's queue at this observation, all links."""
    rtt_s: float = 0.0
    """The worst smoothed RTT of the links (0: unknown)."""
    sampled_at_s: float = 0.0


@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    window_s: float = 3.0
    """How long a busy sample counts: a lower capacity shows after at most this long."""
    busy_queue_bytes: int = 1
    """Queue at both ends of an interval for it to count as busy (bytes, in the readings' unit)."""
    min_interval_s: float = 1e-3
    """Observations closer than this to the previous one are ignored (the baseline stays): a rate
    over a very short span is noise (a shaper's burst, ACK clumping), not capacity."""

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")
        if self.busy_queue_bytes < 1:
            raise ValueError(f"busy_queue_bytes must be >= 1, got {self.busy_queue_bytes}")
        if not self.min_interval_s > 0:
            raise ValueError(f"min_interval_s must be > 0, got {self.min_interval_s}")


class CapacityEstimator:
    """Max-filtered busy goodput of one inter-site link (all of a sender's connections to it)."""

    def __init__(
        self, configured_bytes_per_s: float, config: EstimatorConfig | None = None
    ) -> None:
        if configured_bytes_per_s < 0:
            raise ValueError(f"configured rate must be >= 0, got {configured_bytes_per_s}")
        self.config = config or EstimatorConfig()
        self.configured_bytes_per_s = configured_bytes_per_s
        self._prev: dict[Hashable, LinkReading] | None = None
        self._prev_queue = 0
        self._prev_at_s = 0.0
        self._samples: deque[tuple[float, float]] = deque()  # (at_s, goodput), goodput descending
        self._measured: float | None = None
        self.latest = CapacityEstimate(configured_bytes_per_s, "configured")

    def set_configured(self, configured_bytes_per_s: float) -> None:
        """The deployment's nominal rate changed: it stands until the first measurement."""
        self.configured_bytes_per_s = configured_bytes_per_s
        if self._measured is None:
            self.latest = CapacityEstimate(configured_bytes_per_s, "configured")

    def observe(self, now_s: float, readings: Mapping[Hashable, LinkReading]) -> CapacityEstimate:
        """Fold in the links' counters at ``now_s``; returns (and keeps as ``latest``) the
        estimate. The first call only sets the baseline."""
        cfg = self.config
        queue = sum(max(0, r.queue_bytes) for r in readings.values())
        rtt = max((r.rtt_s for r in readings.values()), default=0.0)
        prev = self._prev
        if prev is not None and now_s - self._prev_at_s < cfg.min_interval_s:
            return self.latest
        goodput = 0.0
        busy = False
        if prev is not None:
            dt = now_s - self._prev_at_s
            acked = 0
            for key, r in readings.items():
                before = prev.get(key)
                if before is None:
                    continue  # a new link: counted from this reading on
                # A counter that went backwards belongs to a replaced link: its bytes since the
                # replacement are unknown, so this interval counts none of them.
                acked += max(0, r.bytes_acked - before.bytes_acked)
            goodput = acked / dt
            busy = (
                goodput > 0
                and self._prev_queue >= cfg.busy_queue_bytes
                and queue >= cfg.busy_queue_bytes
            )
            self._expire(now_s)
            if busy or goodput > self._current():
                self._push(now_s, goodput)
        self._prev = dict(readings)
        self._prev_queue = queue
        self._prev_at_s = now_s
        if self._samples:
            self._measured = self._samples[0][1]
        measured = self._measured
        self.latest = CapacityEstimate(
            capacity_bytes_per_s=measured if measured is not None else self.configured_bytes_per_s,
            basis="measured" if measured is not None else "configured",
            goodput_bytes_per_s=goodput,
            busy=busy,
            queue_bytes=queue,
            rtt_s=rtt,
            sampled_at_s=now_s,
        )
        return self.latest

    def _current(self) -> float:
        return self._measured if self._measured is not None else self.configured_bytes_per_s

    def _expire(self, now_s: float) -> None:
        horizon = now_s - self.config.window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()

    def _push(self, at_s: float, goodput: float) -> None:
        # Monotone deque: a sample older and not larger than a newer one can never be the max
        # again, so the front is always the window's max (O(1) amortised per sample).
        while self._samples and self._samples[-1][1] <= goodput:
            self._samples.pop()
        self._samples.append((at_s, goodput))
