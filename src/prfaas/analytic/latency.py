"""TTFT by the paper's recipe: the per-request prefill latency on the hardware a request is routed
to, with no queueing; mean and quantiles over the length distribution. Exact (quadrature and
root-finding on the distribution's CDF), not sampled. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prfaas.analytic.lengths import LengthDistribution


@dataclass(frozen=True, slots=True)
class LatencyRoute:
    """Requests with lo < L <= hi take ``latency_s(L)`` (non-decreasing in L)."""

    lo: float
    hi: float
    latency_s: Callable[[float], float]


def _largest_length_within(route: LatencyRoute, budget_s: float) -> float:
    """The largest L in (lo, hi] with latency_s(L) <= budget_s (lo if none), by bisection."""
    lo, hi = route.lo, route.hi
    if route.latency_s(hi) <= budget_s:
        return hi
    if route.latency_s(max(lo, 1.0)) > budget_s:
        return lo
    for _ in range(80):
        mid = (lo + hi) / 2
        if route.latency_s(mid) <= budget_s:
            lo = mid
        else:
            hi = mid
    return lo


def latency_cdf(dist: LengthDistribution, routes: Sequence[LatencyRoute], y_s: float) -> float:
    """P(TTFT <= y_s)."""
    total = 0.0
    for route in routes:
        cut = _largest_length_within(route, y_s)
        total += float(dist.cdf(cut) - dist.cdf(route.lo))
    return total


def latency_mean(dist: LengthDistribution, routes: Sequence[LatencyRoute]) -> float:
    return sum(dist.partial_expect(r.latency_s, r.lo, r.hi) for r in routes)


def latency_quantile(dist: LengthDistribution, routes: Sequence[LatencyRoute], q: float) -> float:
    """The smallest y with P(TTFT <= y) >= q, by bisection over latency."""
    lo = 0.0
    hi = max(r.latency_s(r.hi) for r in routes if r.hi > r.lo)
    for _ in range(80):
        mid = (lo + hi) / 2
        if latency_cdf(dist, routes, mid) >= q:
            hi = mid
        else:
            lo = mid
    return hi
