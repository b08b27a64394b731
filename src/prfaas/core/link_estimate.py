"""``CapacityEstimator``: an inter-site link's capacity estimated from what its senders observe.

The live ``LinkState.capacity_bytes_per_s`` must follow the link the KV really crosses, not the
rate the deployment file names: a link can lose capacity underneath a running deployment (a
shaper, a congested path, a failed member of a bond) without anyone telling prfaas.

Each ``observe(now_s, readings)`` takes, per connection set (one ``LinkReading`` per transfer link
of the sender: cumulative bytes the receiver acknowledged, the sender's queue now, its RTT, and the
cumulative seconds its own accounting found it link-limited), and differentiates it against an
earlier call: the latest one at least ``min_interval_s`` before (every call is kept as a possible
start, so a span of that length ends at every observation, not on a fixed grid). Per span:

- *goodput* = acknowledged bytes / seconds, summed over the links (a link that appeared in the
  span counts from its first reading; one whose counter went backwards was replaced and counts
  from its new value);
- the span is *link-limited* (``busy``) when the sender had more to send than the link took for
  (nearly) all of it, so the goodput is what the link gives, not what the producer offered:
  either the sender's accounting says the link held it back for at least ``busy_fraction`` of
  the span (a link's ``link_limited_s`` grew by that much: its pacer was in debt, or a writer
  waited for socket space), or the queue only the network drains (the kernel's unsent bytes) held
  at the span's start (at least ``busy_queue_bytes``) as much as the link delivered in the whole
  span (then it cannot have run dry in between, up to the bytes in flight: bytes leave in order).
  A queue seen at two instants is not enough: bursty production (KV comes per layer) leaves a
  queue at sample instants while the link idles between bursts; nor is a queue that stood all
  along in the sender's process: a process starved of CPU leaves it standing while the link
  idles. Such spans under-read the link. Spans that are not link-limited are *app-limited*
  (BBR's marking).

The estimate is the highest link-limited goodput within the last ``window_s`` (a max filter, as
BBR's bottleneck-bandwidth filter: a link-limited span measures the link or less, never more, so
the max is the tightest lower bound the window holds). Only link-limited spans lower or hold the
estimate; an app-limited span says only that the link carried at least that much, so it enters
the filter only when it is above the estimate (the link proved faster than believed, e.g. after
it recovered while the queue stayed empty). With nothing in the window the last estimate is held:
an idle link is not assumed to have changed, with one exception. A measured estimate below the
configured rate on a link that has carried nothing for ``probe_after_s`` steps up by
``probe_gain`` (at most to the configured rate), and again after each further such stretch: with
nothing crossing, nothing can show the link recovered, and the threshold tuned to the low estimate
may be what keeps every request off it (fresh-clone CI, 2026-12-07: the tbf rate lowered and
restored, the tuner's ``t`` above every prompt in the window, the estimate stuck at a quarter of
the lowered rate for two waves). A step that overshoots costs little: the requests it lets
through queue on the link and the first link-limited span measures it again.
Until the first sample enters the filter the estimate is the ``configured`` rate (basis
``"configured"``); from then on it is ``"measured"``.

Units are the caller's (bytes per second of whatever the readings count). Pure: no I/O, no clock
reads (``now_s`` is passed in); imports nothing outside the standard library.
"""

from __future__ import annotations

import dataclasses
import math
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
    link_limited_s: float | None = None
    """Cumulative seconds the sender's own accounting found this link held back by the link (its
    pacer in debt, a writer waiting for socket space); None: not accounted (the queue rule alone
    applies)."""
    network_queue_bytes: int | None = None
    """The part of ``queue_bytes`` only the network drains (the kernel's unsent bytes: they leave
    whether or not the sender's process runs); None: all of it."""


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    """The estimate after one observation."""

    capacity_bytes_per_s: float
    basis: CapacityBasis
    goodput_bytes_per_s: float = 0.0
    """Acknowledged bytes per second over the last interval."""
    busy: bool = False
    """The last span was link-limited (its goodput measured the link)."""
    limited_fraction: float = 0.0
    """Share of the last span the link held the sender back (the most limited link; 0: unknown)."""
    span_s: float = 0.0
    """Length of the last span (0: no span yet)."""
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
    """Least network queue at a span's start for the queue rule to mark it link-limited (bytes,
    in the readings' unit)."""
    min_interval_s: float = 1e-3
    """Shortest span a rate is taken over: a rate over a very short span is noise (a shaper's
    burst, ACK clumping), not capacity. Until a call that long ago exists, a call only records."""
    busy_fraction: float = 0.9
    """Share of a span the link must have held the sender back for it to be link-limited: not 1,
    as a paced sender's debt clears for an instant whenever its writers catch up."""
    probe_after_s: float = 10.0
    """How long a link whose measured estimate is below the configured rate may carry nothing
    before the estimate steps up (and between steps): at least ``window_s``, so the filter has
    emptied and only the quiet is left to go on."""
    probe_gain: float = 2.0
    """Each step multiplies the estimate by this (capped at the configured rate)."""

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")
        if self.busy_queue_bytes < 1:
            raise ValueError(f"busy_queue_bytes must be >= 1, got {self.busy_queue_bytes}")
        if not self.min_interval_s > 0:
            raise ValueError(f"min_interval_s must be > 0, got {self.min_interval_s}")
        if not 0 < self.busy_fraction <= 1:
            raise ValueError(f"busy_fraction must be in (0, 1], got {self.busy_fraction}")
        if not self.probe_after_s >= self.window_s:
            raise ValueError(
                f"probe_after_s must be >= window_s ({self.window_s}), got {self.probe_after_s}"
            )
        if not self.probe_gain > 1:
            raise ValueError(f"probe_gain must be > 1, got {self.probe_gain}")


class CapacityEstimator:
    """Max-filtered busy goodput of one inter-site link (all of a sender's connections to it)."""

    def __init__(
        self, configured_bytes_per_s: float, config: EstimatorConfig | None = None
    ) -> None:
        if configured_bytes_per_s < 0:
            raise ValueError(f"configured rate must be >= 0, got {configured_bytes_per_s}")
        self.config = config or EstimatorConfig()
        self.configured_bytes_per_s = configured_bytes_per_s
        # Earlier calls that may still start a span: (at_s, readings, network queue), oldest; the
        # front is the latest one at least min_interval_s before the newest call.
        self._history: deque[tuple[float, dict[Hashable, LinkReading], int]] = deque()
        self._samples: deque[tuple[float, float]] = deque()  # (at_s, goodput), goodput descending
        self._measured: float | None = None
        self._carried_s: float | None = None
        """The latest span that carried bytes, or the latest probe step (the quiet since)."""
        self.latest = CapacityEstimate(configured_bytes_per_s, "configured")

    def set_configured(self, configured_bytes_per_s: float) -> None:
        """The deployment's nominal rate changed: it stands until the first measurement."""
        self.configured_bytes_per_s = configured_bytes_per_s
        if self._measured is None:
            self.latest = dataclasses.replace(
                self.latest, capacity_bytes_per_s=configured_bytes_per_s
            )

    def observe(self, now_s: float, readings: Mapping[Hashable, LinkReading]) -> CapacityEstimate:
        """Fold in the links' counters at ``now_s``; returns (and keeps as ``latest``) the
        estimate. Calls until one lies ``min_interval_s`` back only record (the first one sets
        the baseline); a call at or before the newest recorded one is ignored."""
        cfg = self.config
        queue = sum(max(0, r.queue_bytes) for r in readings.values())
        rtt = max((r.rtt_s for r in readings.values()), default=0.0)
        hist = self._history
        if hist and now_s <= hist[-1][0]:
            return self.latest
        while len(hist) > 1 and now_s - hist[1][0] >= cfg.min_interval_s:
            hist.popleft()  # a later call is far enough back: this one never starts a span again
        goodput = 0.0
        busy = False
        fraction = 0.0
        span = 0.0
        if hist and now_s - hist[0][0] >= cfg.min_interval_s:
            at0, prev, net_queue0 = hist[0]
            span = now_s - at0
            acked = 0
            for key, r in readings.items():
                before = prev.get(key)
                if before is None:
                    continue  # a new link: counted from this reading on
                # A counter that went backwards belongs to a replaced link: its bytes since the
                # replacement are unknown, so this span counts none of them.
                acked += max(0, r.bytes_acked - before.bytes_acked)
                if r.link_limited_s is not None and before.link_limited_s is not None:
                    grew = max(0.0, r.link_limited_s - before.link_limited_s)
                    fraction = max(fraction, min(1.0, grew / span))
            goodput = acked / span
            covered = net_queue0 >= cfg.busy_queue_bytes and net_queue0 >= acked
            busy = goodput > 0 and (fraction >= cfg.busy_fraction or covered)
            self._expire(now_s)
            if busy or goodput > self._current():
                self._push(now_s, goodput)
            if acked > 0:
                self._carried_s = now_s
        if self._carried_s is None:
            self._carried_s = now_s  # the first call: the quiet is counted from here
        net_queue = sum(
            max(0, r.queue_bytes if r.network_queue_bytes is None else r.network_queue_bytes)
            for r in readings.values()
        )
        hist.append((now_s, dict(readings), net_queue))
        if self._samples:
            self._measured = self._samples[0][1]
        self._probe(now_s)
        measured = self._measured
        self.latest = CapacityEstimate(
            capacity_bytes_per_s=measured if measured is not None else self.configured_bytes_per_s,
            basis="measured" if measured is not None else "configured",
            goodput_bytes_per_s=goodput,
            busy=busy,
            limited_fraction=fraction,
            span_s=span,
            queue_bytes=queue,
            rtt_s=rtt,
            sampled_at_s=now_s,
        )
        return self.latest

    def _current(self) -> float:
        return self._measured if self._measured is not None else self.configured_bytes_per_s

    def _probe(self, now_s: float) -> None:
        """Step a measured estimate up after ``probe_after_s`` with nothing carried (see the
        module's docstring)."""
        cfg, measured, quiet_since = self.config, self._measured, self._carried_s
        if measured is None or quiet_since is None or measured >= self.configured_bytes_per_s:
            return
        if now_s - quiet_since < cfg.probe_after_s:
            return
        self._expire(now_s)
        if self._samples:  # only when the filter holds nothing: a sample there is evidence
            return
        self._measured = min(self.configured_bytes_per_s, measured * cfg.probe_gain)
        self._carried_s = now_s

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


GOODPUT_EWMA_S = 2.0
"""Time constant of a link's goodput average, seconds (modelled): what the congestion rule's
utilisation reads, in the simulator's link and in the gateway's registry alike."""


class DeliveredRate:
    """A link's goodput as the congestion rule reads it: an exponentially weighted average, over
    about ``ewma_s``, of the rate at which bytes were *delivered* (cumulative delivered bytes
    passed in at each observation, at irregular instants). Not the instantaneous sum of rates,
    which flickers to 100% whenever one flow is unpaced. The simulator's link (its fluid model's
    delivered bytes) and the gateway's registry (bytes the senders accepted less those not yet
    acknowledged) both keep one, so the same delivery history gives the same utilisation.
    Pure: ``now_s`` is passed in."""

    __slots__ = ("_at_s", "_bytes", "ewma_s", "rate_bytes_per_s")

    def __init__(self, ewma_s: float = GOODPUT_EWMA_S, start_s: float = 0.0) -> None:
        if not ewma_s > 0:
            raise ValueError(f"ewma_s must be > 0, got {ewma_s}")
        self.ewma_s = ewma_s
        self.rate_bytes_per_s = 0.0
        self._at_s = start_s
        self._bytes = 0.0

    def observe(self, now_s: float, delivered_bytes: float) -> float:
        """Fold in the cumulative ``delivered_bytes`` at ``now_s`` (non-decreasing: a caller
        whose counters can reset keeps them monotone); returns the average. A call at or before
        the previous one changes nothing."""
        dt = now_s - self._at_s
        if dt > 0:
            inst = (delivered_bytes - self._bytes) / dt
            w = 1.0 - math.exp(-dt / self.ewma_s)
            self.rate_bytes_per_s += w * (inst - self.rate_bytes_per_s)
            self._at_s, self._bytes = now_s, delivered_bytes
        return self.rate_bytes_per_s
