"""``prfaas bench --find-max-rate``: a live endpoint's CAPACITY by the simulator's rule
(``sim/maxrate.py``, ``prfaas/capacity.py``): the highest constant open-loop arrival rate at
which no stage's backlog grows and the decode SLO holds.

Live, the stages' queues are not visible from the client: a backlog shows as requests waiting
longer the later they are sent. One step sends the same requests (same seed, same lengths) at a
constant rate ``r`` over ``D`` seconds; the step *passes* when
- the requests' latencies, fitted by least squares against their send times, grow by at most
  ``max_trend`` seconds per second of sending (a stage at utilisation ``rho > 1`` makes the
  ``k``-th request wait ``(rho - 1) x t_k`` longer: steps up to ``rho`` 1.04 pass),
- the requests in flight at the end of sending are not more than at ``D / 2`` by over
  ``max_in_flight_growth`` of the requests sent in between (and 5): a backlog the latencies'
  trend can miss where a server shares every step among all it holds (measured: a vLLM server
  at 24.8 req/s held 119 requests at ``D / 2`` and 232 of 240 at ``D``, its latencies' slope
  -0.30, as every request in flight finished only as the sending stopped; docs/fidelity.md),
- every request completed (a 429 or a timeout is overload),
- and, with a decode SLO, the P90 time per output token meets it.
The fit uses every request, so one long prompt in flight at an instant does not decide a step:
the requests in flight at ``D / 2`` and ``D`` (the rule until 2026-12-05, still reported) grow
by a request or two at any rate on a short step, and on 60 requests of a heavy-tailed workload
the simulator's own steps passed at 4.2 req/s, failed at 4.3-4.9, passed at 5.0-5.5 where 1,500
requests put the capacity at 6.8 (docs/fidelity.md). The trend is monotone in the rate, but a
short step is conservative (the first requests find the system empty): send a few hundred.
Search: from ``start_rps`` multiply by ``step_factor`` while steps pass (divide while they fail),
then bisect until ``hi / lo <= 1 + rel_tol``; the answer is the highest rate that passed.

The judging is pure (``judge_step`` over ``RequestResult`` rows); ``find_max_rate_live`` drives
steps through an injected ``run_step`` (the command sends real requests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from prfaas.serve.loadgen.client import RequestResult


@dataclass(frozen=True, slots=True)
class LiveRule:
    max_trend: float = 0.04
    """Latency growth allowed, in seconds per second of sending (the least-squares slope of the
    requests' latencies against their send times): a stage at utilisation ``rho > 1`` makes it
    ``rho - 1``, so steps up to ``rho`` 1.04 pass (the simulator allows a backlog of 0.0025 x D
    at 20,000 requests; live steps are shorter)."""
    slo_tpot_s: float | None = None
    max_in_flight_growth: float = 0.25
    """Backlog growth allowed, as the increase of the requests in flight from ``D / 2`` to
    ``D`` over the requests sent in between: ``1 - 1 / rho`` at utilisation ``rho``, so only
    ``rho`` above 1.33 fails here (the trend judges the steps near capacity; over four fidelity
    rounds, 24 searches, no step that passed otherwise grew by more than 25%, 2026-12-06)."""
    step_factor: float = 2.0
    """Bracketing: the rate doubles while steps pass (halves while they fail), as the
    simulator's search does; the bisection then narrows to ``rel_tol``. A step of ``N``
    requests at rate ``r`` lasts ``N / r``: the low rates are the long steps, so a bracket in
    few of them matters (1.25 took 7 steps of 300 requests from 2 to 7.6 req/s, 10 minutes)."""
    rel_tol: float = 0.05
    max_steps: int = 12


@dataclass(frozen=True, slots=True)
class LiveStep:
    rate_rps: float
    passed: bool
    why: str
    in_flight_half: int
    in_flight_end: int
    window_s: float
    completed: int
    num_requests: int
    tpot_p90_s: float | None
    latency_trend: float | None = None
    """The fitted latency growth, seconds per second of sending (None: fewer than 2 finished)."""


def in_flight_at(results: Sequence[RequestResult], t_s: float) -> int:
    """Requests sent by ``t_s`` and not finished by then (a failed one counts until it failed,
    unknown: until the end)."""
    n = 0
    for r in results:
        if r.sent_s > t_s:
            continue
        end = r.sent_s + r.latency_s if r.latency_s is not None else float("inf")
        n += end > t_s
    return n


def latency_trend(results: Sequence[RequestResult]) -> float | None:
    """The least-squares slope of the finished requests' latencies against their send times
    (seconds per second); None with fewer than two send times."""
    pts = np.array([(r.sent_s, r.latency_s) for r in results if r.ok and r.latency_s is not None])
    if len(pts) < 2 or np.ptp(pts[:, 0]) == 0.0:
        return None  # nothing to fit, or all sent at once: no trend to read
    return float(np.polyfit(pts[:, 0], pts[:, 1], 1)[0])


def judge_step(
    results: Sequence[RequestResult], rate_rps: float, window_s: float, rule: LiveRule
) -> LiveStep:
    half, end = in_flight_at(results, window_s / 2), in_flight_at(results, window_s)
    completed = sum(r.ok for r in results)
    tpots = sorted(t for r in results if (t := r.tpot_s) is not None)
    p90 = tpots[min(len(tpots) - 1, int(0.9 * len(tpots)))] if tpots else None
    trend = latency_trend(results)
    why = ""
    sent_since_half = sum(window_s / 2 < r.sent_s <= window_s for r in results)
    if completed < len(results):
        why = f"{len(results) - completed} of {len(results)} failed"
    elif trend is not None and trend > rule.max_trend:
        why = f"latency grew {trend:.3f} s per s of sending (> {rule.max_trend:g})"
    elif end - half > max(5, rule.max_in_flight_growth * sent_since_half):
        why = (
            f"requests in flight grew from {half} to {end} while {sent_since_half} were sent "
            f"(> {rule.max_in_flight_growth:.0%} of them)"
        )
    elif rule.slo_tpot_s is not None and p90 is not None and p90 > rule.slo_tpot_s:
        why = f"TPOT P90 {p90 * 1e3:.1f} ms > SLO {rule.slo_tpot_s * 1e3:.1f} ms"
    return LiveStep(rate_rps, not why, why or "ok", half, end, window_s, completed, len(results),
                    p90, trend)  # fmt: skip


def find_max_rate_live(
    run_step: Callable[[float], tuple[Sequence[RequestResult], float]],
    start_rps: float,
    rule: LiveRule | None = None,
    on_step: Callable[[LiveStep], None] | None = None,
) -> tuple[float, tuple[LiveStep, ...]]:
    """(capacity, steps). ``run_step(rate)`` sends the step's requests at ``rate`` and returns
    their results and the sending window ``D`` in seconds."""
    rule = rule or LiveRule()
    if not start_rps > 0:
        raise ValueError(f"start rate must be > 0, got {start_rps}")
    steps: list[LiveStep] = []

    def run(rate: float) -> bool:
        results, window_s = run_step(rate)
        step = judge_step(results, rate, window_s, rule)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        return step.passed

    lo, hi, rate = 0.0, 0.0, start_rps
    if run(rate):
        lo = rate
        while len(steps) < rule.max_steps:
            rate *= rule.step_factor
            if not run(rate):
                hi = rate
                break
            lo = rate
    else:
        hi = rate
        while len(steps) < rule.max_steps:
            rate /= rule.step_factor
            if run(rate):
                lo = rate
                break
            hi = rate
    while lo > 0 and hi > 0 and hi / lo > 1 + rule.rel_tol and len(steps) < rule.max_steps:
        mid = (lo * hi) ** 0.5
        if run(mid):
            lo = mid
        else:
            hi = mid
    return lo, tuple(steps)
