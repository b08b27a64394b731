"""Arrival processes: uniform, Poisson, bursty (gamma inter-arrivals, on/off modulated Poisson).

Each yields arrival times in seconds, lazily, in increasing order, from 0 up to ``duration_s``.
All processes have the same long-run mean rate ``rate_rps``; burstiness changes only the variance.
Pure: randomness from the ``random.Random`` passed in; no clock, no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

ARRIVAL_KINDS = ("uniform", "poisson", "gamma", "onoff")


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    kind: str = "uniform"
    """``uniform`` (evenly spaced, the paper's assumption), ``poisson``, ``gamma`` (inter-arrival
    coefficient of variation ``cv``) or ``onoff`` (Poisson at ``rate / on_fraction`` during on
    periods of mean ``on_s``, nothing in between)."""
    rate_rps: float = 1.0
    """Long-run mean arrival rate, requests per second."""
    cv: float = 2.0
    """gamma: coefficient of variation of inter-arrival times (1 = Poisson)."""
    on_s: float = 10.0
    """onoff: mean length of an on period (exponential)."""
    on_fraction: float = 0.5
    """onoff: long-run fraction of time in the on state."""

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValueError(
                f"unknown arrival kind {self.kind!r} (known: {', '.join(ARRIVAL_KINDS)})"
            )
        if not self.rate_rps > 0:
            raise ValueError(f"arrival rate must be > 0 requests/s, got {self.rate_rps}")
        if not self.cv > 0:
            raise ValueError(f"gamma cv must be > 0, got {self.cv}")
        if not self.on_s > 0:
            raise ValueError(f"on period must be > 0 s, got {self.on_s}")
        if not 0 < self.on_fraction <= 1:
            raise ValueError(f"on_fraction must be in (0, 1], got {self.on_fraction}")


def arrival_times(spec: ArrivalSpec, duration_s: float, rng: random.Random) -> Iterator[float]:
    """Arrival times in [0, duration_s) following ``spec``."""
    rate = spec.rate_rps
    if spec.kind == "uniform":
        # i / rate, computed (not accumulated) so long runs do not drift.
        i = 0
        while True:
            t = i / rate
            if t >= duration_s:
                return
            yield t
            i += 1
    elif spec.kind == "poisson":
        yield from _renewal(lambda: rng.expovariate(rate), duration_s)
    elif spec.kind == "gamma":
        shape = 1.0 / (spec.cv * spec.cv)
        scale = 1.0 / (rate * shape)
        yield from _renewal(lambda: rng.gammavariate(shape, scale), duration_s)
    else:
        yield from _on_off(spec, duration_s, rng)


def _renewal(gap: object, duration_s: float) -> Iterator[float]:
    assert callable(gap)
    t = gap()
    while t < duration_s:
        yield t
        t += gap()


def _on_off(spec: ArrivalSpec, duration_s: float, rng: random.Random) -> Iterator[float]:
    on_rate = spec.rate_rps / spec.on_fraction
    off_mean_s = spec.on_s * (1.0 - spec.on_fraction) / spec.on_fraction
    t = 0.0
    while t < duration_s:
        on_end = t + rng.expovariate(1.0 / spec.on_s)
        t += rng.expovariate(on_rate)
        while t < on_end and t < duration_s:
            yield t
            t += rng.expovariate(on_rate)
        t = on_end + (rng.expovariate(1.0 / off_mean_s) if off_mean_s > 0 else 0.0)
