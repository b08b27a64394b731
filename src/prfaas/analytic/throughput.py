"""The paper's Eqs. 1-6, one function each, over a cost model and a length distribution.

Two variants of each prefill stage's capacity:
- the paper's (``exact=False``): service time of the mean length, ``T(E[L | route])``;
- exact service (``exact=True``): mean service time, ``E[T(L) | route]``. Prefill time is convex in
  length, so by Jensen the paper's shortcut overstates capacity; a queue really sees the latter.
Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prfaas.analytic.lengths import LengthDistribution, mean_above, mean_at_or_below, prob_above
from prfaas.perf.cost_model import CostModel


def phi_kv_gbps(cost: CostModel, num_tokens: int) -> float:
    """Eq. 1: KV throughput of one instance prefilling ``num_tokens``."""
    return cost.kv_bytes(num_tokens) * 8 / cost.prefill_s(num_tokens) / 1e9


def required_egress_gbps(cost: CostModel, num_instances: int, mean_tokens: int) -> float:
    """Eq. 2: egress a cluster of ``num_instances`` instances needs at length ``mean_tokens``."""
    return num_instances * phi_kv_gbps(cost, mean_tokens)


@dataclass(frozen=True, slots=True)
class RouteMoments:
    """What a stage sees of the requests routed to it (offloaded: L > t; local: L <= t)."""

    share: float
    """Fraction of all requests (p for the PrfaaS route)."""
    mean_tokens: float
    mean_prefill_s: float
    """T(E[L]) for the paper's shortcut, E[T(L)] for exact service."""
    mean_kv_bytes: float


def _route(
    dist: LengthDistribution,
    cost: CostModel,
    lo: float,
    hi: float,
    exact: bool,
) -> RouteMoments:
    share = float(dist.cdf(hi) - dist.cdf(lo))
    if share <= 0:
        return RouteMoments(0.0, math.nan, math.nan, math.nan)
    mean_tokens = float(dist.partial_mean(lo, hi)) / share
    l_mean = max(1, round(mean_tokens))
    if exact:
        prefill = dist.partial_expect(lambda x: cost.prefill_s(max(1, round(x))), lo, hi) / share
    else:
        prefill = cost.prefill_s(l_mean)
    # S_kv is affine in length for GQA/MLA/linear layers, so S(E[L]) = E[S(L)] up to SWA windows.
    kv = float(cost.kv_bytes(l_mean))
    return RouteMoments(share, mean_tokens, prefill, kv)


def offload_moments(
    dist: LengthDistribution, cost: CostModel, threshold: float, exact: bool
) -> RouteMoments:
    return _route(dist, cost, threshold, dist.max_tokens, exact)


def local_moments(
    dist: LengthDistribution, cost: CostModel, threshold: float, exact: bool
) -> RouteMoments:
    return _route(dist, cost, 0.0, threshold, exact)


def theta_prfaas(route: RouteMoments, n_prfaas: int, link_bytes_per_s: float) -> float:
    """Eq. 3: min(compute, egress) throughput of the PrfaaS cluster, requests/s."""
    if route.share <= 0:
        return 0.0
    return min(n_prfaas / route.mean_prefill_s, link_bytes_per_s / route.mean_kv_bytes)


def theta_pdp(route: RouteMoments, n_p: int) -> float:
    """Eq. 4: PD-P throughput on the short requests, requests/s."""
    if route.share <= 0 or n_p == 0:
        return 0.0
    return n_p / route.mean_prefill_s


def theta_pdd(n_d: int, max_batch: int, step_s: float, output_tokens: int) -> float:
    """Eq. 5: PD-D throughput, requests/s."""
    return n_d * max_batch / (step_s * output_tokens)


def lambda_max(theta_remote: float, theta_local: float, theta_decode: float, p: float) -> float:
    """Eq. 6: the largest arrival rate every stage sustains."""
    bounds = [theta_decode]
    if p > 0:
        bounds.append(theta_remote / p)
    if p < 1:
        bounds.append(theta_local / (1 - p))
    return min(bounds)


__all__ = [
    "RouteMoments",
    "lambda_max",
    "local_moments",
    "mean_above",
    "mean_at_or_below",
    "offload_moments",
    "phi_kv_gbps",
    "prob_above",
    "required_egress_gbps",
    "theta_pdd",
    "theta_pdp",
    "theta_prfaas",
]
