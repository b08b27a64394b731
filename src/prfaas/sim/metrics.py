"""Run metrics: per-request latencies, per-site and per-link counters, time series, and the one
JSON-ready summary (``summary``). Deterministic: no wall-clock figures ever enter it. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _q(sorted_xs: Sequence[float], q: float) -> float:
    if not sorted_xs:
        return 0.0
    i = min(len(sorted_xs) - 1, max(0, math.ceil(q * len(sorted_xs)) - 1))
    return sorted_xs[i]


def dist(xs: list[float]) -> dict[str, float]:
    """mean / p50 / p90 / p99 / max (nearest-rank percentiles)."""
    if not xs:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    s = sorted(xs)
    return {
        "mean": r(sum(s) / len(s)),
        "p50": r(_q(s, 0.50)),
        "p90": r(_q(s, 0.90)),
        "p99": r(_q(s, 0.99)),
        "max": r(s[-1]),
    }


def r(x: float) -> float:
    """Round for the JSON: 9 significant digits keeps it readable and stable."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.9g}")


class Metrics:
    def __init__(self) -> None:
        self.ttft_s: list[float] = []
        self.tpot_s: list[float] = []
        self.e2e_s: list[float] = []
        self.num_arrived = 0
        self.num_completed = 0
        self.num_counted = 0
        self.num_failed = 0
        self.num_offloaded = 0
        self.num_rerouted = 0
        self.num_cache_moves = 0
        self.output_tokens = 0
        self.prompt_tokens = 0
        """Prompt tokens of the completed requests (what they were served, cached or not)."""
        self.num_good = 0
        self.last_arrival_s = 0.0
        self.first_finish_s = math.inf
        self.last_finish_s = 0.0
        self.threshold_updates: list[dict[str, object]] = []
        self.role_changes: list[dict[str, object]] = []
        self.samples_t: list[float] = []
        self.series: dict[str, list[float]] = {}
        self.max_tpot_s = 0.0

    def sample(self, key: str, value: float) -> None:
        self.series.setdefault(key, []).append(r(value))
