"""Load shapes for the elastic-pool simulator: a trace replayed under a rate profile.

``RateProfile`` multiplies the trace's own rate over time (``periodic_burst``: x4 for 5 minutes
every 30 minutes; ``ramp``: up, hold, down, every period); ``warp`` maps the trace's arrival
times onto simulated time so that the rate at simulated time ``t`` is the trace's times the
profile's ``factor(t)``, replaying the trace cyclically (each pass's block hashes are not used:
the pool is modelled without prefix reuse). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateProfile:
    kind: str = "flat"
    """``flat`` | ``burst`` (x``factor`` for ``burst_s`` every ``period_s``) | ``ramp`` (from 1 to
    ``factor`` over ``ramp_s``, hold ``burst_s``, back over ``ramp_s``, every ``period_s``)."""
    factor: float = 1.0
    period_s: float = 1800.0
    burst_s: float = 300.0
    ramp_s: float = 600.0
    offset_s: float = 600.0
    """The first burst starts here (the pool has a steady state to leave from)."""

    def factor_at(self, t_s: float) -> float:
        if self.kind == "flat" or t_s < self.offset_s:
            return 1.0
        phase = (t_s - self.offset_s) % self.period_s
        if self.kind == "burst":
            return self.factor if phase < self.burst_s else 1.0
        if self.kind == "ramp":
            up = self.ramp_s
            if phase < up:
                return 1.0 + (self.factor - 1.0) * phase / up
            if phase < up + self.burst_s:
                return self.factor
            if phase < 2 * up + self.burst_s:
                return self.factor - (self.factor - 1.0) * (phase - up - self.burst_s) / up
            return 1.0
        raise ValueError(f"rate profile kind must be flat, burst or ramp, got {self.kind!r}")


@dataclass(frozen=True, slots=True)
class Arrival:
    index: int
    arrival_s: float
    num_prompt_tokens: int


def warp(
    records: Iterable[tuple[float, int]],
    profile: RateProfile,
    duration_s: float,
    base_scale: float = 1.0,
    step_s: float = 1.0,
) -> Iterator[Arrival]:
    """(trace arrival s, prompt tokens) replayed under ``profile`` (times ``base_scale``) until
    ``duration_s`` of simulated time; the trace repeats when it runs out."""
    rows = list(records)
    if not rows:
        return
    span = rows[-1][0] + 1.0
    t_sim = 0.0
    trace_t = 0.0  # trace seconds consumed by t_sim
    index = 0
    passes = 0
    i = 0
    while t_sim < duration_s:
        rate = profile.factor_at(t_sim) * base_scale
        nxt_trace = trace_t + rate * step_s
        while True:
            at, tokens = rows[i]
            at += passes * span
            if at >= nxt_trace:
                break
            t = t_sim + (at - trace_t) / rate
            if t >= duration_s:
                return
            yield Arrival(index, t, tokens)
            index += 1
            i += 1
            if i == len(rows):
                i = 0
                passes += 1
        trace_t = nxt_trace
        t_sim += step_s
