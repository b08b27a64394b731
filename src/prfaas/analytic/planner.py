"""The planner: the paper's 2-D grid search over threshold ``t`` and split ``N_p / N_d``, the two
baselines, TTFT, egress, the equal-cost comparison and the Eqs. 7-8 optimality check.

Grid: ``t`` from the shortest to the longest length in ``threshold_step_tokens`` steps (all
offloaded ... none offloaded) and every ``N_p`` in 0..n_local-1 (``N_d >= 1``); ties go to the
smaller ``t``. Beside the paper's ``lambda_max`` each deployment reports ``lambda_max_exact``
(Eqs. 3-6 with mean service times) at the same operating point. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from prfaas.analytic.latency import LatencyRoute, latency_mean, latency_quantile
from prfaas.analytic.lengths import mean, mean_above, mean_at_or_below, prob_above
from prfaas.analytic.scenario import Scenario
from prfaas.analytic.throughput import (
    lambda_max,
    local_moments,
    offload_moments,
    theta_pdd,
    theta_pdp,
    theta_prfaas,
)
from prfaas.perf.cost_model import CostModel, cost_model_for


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """The decode operating point fixed by the SLO: Eq. 5's ``BS_max`` and ``T_decode``."""

    max_batch: int
    step_s: float
    source: str


@dataclass(frozen=True, slots=True)
class DeploymentPlan:
    name: str
    """``prfaas``, ``homogeneous`` or ``naive``."""
    threshold_tokens: int | None
    n_prfaas: int
    n_p: int
    n_d: int
    theta_prfaas: float
    theta_pdp: float
    theta_pdd: float
    lambda_max: float
    lambda_max_exact: float
    p_offload: float
    mean_offloaded_tokens: float
    mean_local_tokens: float
    ttft_mean_s: float
    ttft_p90_s: float
    egress_gbps: float
    """PrfaaS egress at ``lambda_max``: offloaded rate x mean KV bytes."""
    num_gpus: int
    cost_units: float
    """GPUs weighted by price (one local GPU = 1)."""


@dataclass(frozen=True, slots=True)
class OptimalityCheck:
    """Eqs. 7-8 at the optimum, within the granularity of the grid."""

    eq7_remote_rps: float
    """Theta_prfaas / p."""
    eq7_local_rps: float
    """Theta_pdp / (1 - p)."""
    eq7_holds: bool
    """The two sides cross within one threshold step of the optimum."""
    eq8_prefill_rps: float
    """Theta_prfaas + Theta_pdp."""
    eq8_decode_rps: float
    eq8_holds: bool
    """|prefill - decode| is at most one instance's worth of the coarser side."""


@dataclass(frozen=True)
class PlanResult:
    scenario: Scenario
    prfaas: DeploymentPlan
    homogeneous: DeploymentPlan
    naive: DeploymentPlan
    decode: DecodePoint
    check: OptimalityCheck
    prefill_sources: dict[str, str] = field(default_factory=dict)

    @property
    def prfaas_vs_homogeneous(self) -> float:
        return self.prfaas.lambda_max / self.homogeneous.lambda_max

    @property
    def prfaas_vs_naive(self) -> float:
        return self.prfaas.lambda_max / self.naive.lambda_max

    @property
    def equal_cost_gain(self) -> float:
        """PrfaaS-PD throughput per cost unit over the homogeneous baseline's."""
        a = self.prfaas.lambda_max / self.prfaas.cost_units
        b = self.homogeneous.lambda_max / self.homogeneous.cost_units
        return a / b


class Planner:
    def __init__(
        self, scenario: Scenario, remote: CostModel | None = None, local: CostModel | None = None
    ) -> None:
        """``remote`` / ``local``: cost models to use instead of the scenario's presets (e.g.
        from profile files)."""
        self.scenario = scenario
        if remote is None:
            remote = cost_model_for(scenario.model, scenario.prfaas_hardware)
        if local is None:
            local = cost_model_for(scenario.model, scenario.local_hardware)
        self.remote: CostModel = remote
        self.local: CostModel = local
        self.decode = self._decode_point()

    def _decode_point(self) -> DecodePoint:
        s = self.scenario
        budget_s = 1.0 / s.decode_slo_tokens_per_s
        context = round(mean(s.lengths) + s.output_tokens / 2)
        batch = self.local.decode_batch_limit(budget_s, context)
        if batch <= 0:
            raise ValueError(
                f"{s.local_hardware} cannot decode {s.model} at {s.decode_slo_tokens_per_s} tok/s "
                "per request even one request at a time"
            )
        step_s = self.local.decode_step_s(batch, batch * context)
        return DecodePoint(batch, step_s, self.local.decode_source)

    def _theta_pdd(self, n_d: int) -> float:
        d = self.decode
        return theta_pdd(n_d, d.max_batch, d.step_s, self.scenario.output_tokens)

    def thresholds(self) -> np.ndarray:
        s = self.scenario
        lo, hi = s.lengths.min_tokens, s.lengths.max_tokens
        grid = np.arange(lo, hi, s.threshold_step_tokens, dtype=np.float64)
        return np.append(grid, float(hi))

    # -- the grid ------------------------------------------------------------------------------
    def bounds_grid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(thresholds, prefill-bound Lambda[t, N_p], decode-bound Lambda[N_p]), paper's shortcut.

        The prefill bound is min(Theta_prfaas / p, Theta_pdp / (1 - p)) (Eqs. 3, 4, 6).
        """
        s = self.scenario
        ts = self.thresholds()
        p = prob_above(s.lengths, ts)
        l_long = mean_above(s.lengths, ts)
        l_short = mean_at_or_below(s.lengths, ts)
        remote = np.zeros_like(ts)
        local_t = np.full_like(ts, np.inf)
        for i, (pi, ll, ls) in enumerate(zip(p, l_long, l_short, strict=True)):
            if pi > 0:
                n = max(1, round(float(ll)))
                remote[i] = min(
                    s.n_prfaas / self.remote.prefill_s(n),
                    s.link_bytes_per_s / self.remote.kv_bytes(n),
                )
            if pi < 1:
                local_t[i] = self.local.prefill_s(max(1, round(float(ls))))
        n_ps = np.arange(s.n_local)  # N_p = 0 .. n_local - 1; N_d = n_local - N_p >= 1
        with np.errstate(divide="ignore", invalid="ignore"):
            remote_bound = np.where(p > 0, remote / p, np.inf)
            local_rate = n_ps[None, :] / local_t[:, None]
            local_bound = np.where((p < 1)[:, None], local_rate / (1 - p)[:, None], np.inf)
        prefill = np.minimum(remote_bound[:, None], local_bound)
        decode = np.array([self._theta_pdd(s.n_local - int(n)) for n in n_ps])
        return ts, np.nan_to_num(prefill, nan=0.0, posinf=0.0), decode

    def lambda_grid(self) -> tuple[np.ndarray, np.ndarray]:
        """(thresholds, Lambda[t, N_p]) with the paper's shortcut (Eqs. 3-6)."""
        ts, prefill, decode = self.bounds_grid()
        return ts, np.minimum(prefill, decode[None, :])

    def plan(self, threshold_tokens: int | None = None, n_p: int | None = None) -> PlanResult:
        """The best (t, N_p) on the grid; with ``threshold_tokens`` only the split is searched,
        with ``n_p`` (a deployment file's roles: ``N_d = n_local - n_p``) only ``t``."""
        s = self.scenario
        ts, lam = self.lambda_grid()
        if threshold_tokens is not None:
            lo, hi = s.lengths.min_tokens, s.lengths.max_tokens
            if not lo <= threshold_tokens <= hi:
                raise ValueError(
                    f"threshold {threshold_tokens} is outside the length range [{lo}, {hi}]"
                )
            ts = np.array([float(threshold_tokens)])
            lam = self._lambda_at(threshold_tokens)[None, :]
        if n_p is not None:
            if not 0 <= n_p < s.n_local:
                raise ValueError(f"N_p {n_p} is outside 0..{s.n_local - 1} (N_d must be >= 1)")
            fixed = np.full_like(lam, -1.0)
            fixed[:, n_p] = lam[:, n_p]
            lam = fixed
        flat = int(np.argmax(lam))  # first maximum: the smallest t, then the smallest N_p
        i, n_p = divmod(flat, lam.shape[1])
        t = int(ts[i])
        prfaas = self._deployment("prfaas", t, s.n_prfaas, n_p, s.n_local - n_p)
        homogeneous = self._homogeneous()
        naive = self._deployment("naive", s.lengths.min_tokens - 1, s.n_prfaas, 0, s.n_local)
        check = self._check(ts, lam, i, n_p, prfaas)
        sources = {
            "prfaas": self.remote.prefill_source,
            "local": self.local.prefill_source,
            "decode": self.decode.source,
        }
        return PlanResult(s, prfaas, homogeneous, naive, self.decode, check, sources)

    def _lambda_at(self, t: int) -> np.ndarray:
        s = self.scenario
        return np.array(
            [
                self._deployment("prfaas", t, s.n_prfaas, n_p, s.n_local - n_p).lambda_max
                for n_p in range(s.n_local)
            ]
        )

    def _homogeneous(self) -> DeploymentPlan:
        s = self.scenario
        best: DeploymentPlan | None = None
        for n_p in range(1, s.n_homogeneous):
            plan = self._deployment(
                "homogeneous", s.lengths.max_tokens, 0, n_p, s.n_homogeneous - n_p
            )
            if best is None or plan.lambda_max > best.lambda_max + 1e-12:
                best = plan
        assert best is not None
        return best

    def evaluate(self, t: int | None, n_prfaas: int, n_p: int, n_d: int) -> DeploymentPlan:
        """A given deployment (not the searched optimum), e.g. one a deployment file describes:
        ``t`` None or ``n_prfaas`` 0 means nothing is offloaded."""
        if n_prfaas == 0 or t is None:
            return self._deployment("homogeneous", self.scenario.lengths.max_tokens, 0, n_p, n_d)
        return self._deployment("prfaas", t, n_prfaas, n_p, n_d)

    # -- one deployment at one operating point ---------------------------------------------------
    def _deployment(self, name: str, t: int, n_prfaas: int, n_p: int, n_d: int) -> DeploymentPlan:
        s = self.scenario
        figures = {}
        for exact in (False, True):
            off = offload_moments(s.lengths, self.remote, t, exact)
            loc = local_moments(s.lengths, self.local, t, exact)
            remote = theta_prfaas(off, n_prfaas, s.link_bytes_per_s) if n_prfaas else 0.0
            local = theta_pdp(loc, n_p)
            figures[exact] = (off, loc, remote, local)
        off, loc, remote, local = figures[False]
        p = off.share
        decode = self._theta_pdd(n_d)
        lam = lambda_max(remote, local, decode, p)
        off_x, _loc_x, remote_x, local_x = figures[True]
        lam_exact = lambda_max(remote_x, local_x, decode, p)
        routes = []
        if p < 1:
            routes.append(
                LatencyRoute(0.0, float(t), lambda x: self.local.prefill_s(max(1, round(x))))
            )
        if p > 0:
            routes.append(
                LatencyRoute(
                    float(t), float(s.lengths.max_tokens),
                    lambda x: self.remote.prefill_s(max(1, round(x))),
                )
            )  # fmt: skip
        egress = lam * p * off_x.mean_kv_bytes * 8 / 1e9 if p > 0 else 0.0
        gpus_remote = n_prfaas * self.remote.hardware.gpus_per_instance
        gpus_local = (n_p + n_d) * self.local.hardware.gpus_per_instance
        return DeploymentPlan(
            name=name,
            threshold_tokens=t if name == "prfaas" else None,
            n_prfaas=n_prfaas,
            n_p=n_p,
            n_d=n_d,
            theta_prfaas=remote,
            theta_pdp=local,
            theta_pdd=decode,
            lambda_max=lam,
            lambda_max_exact=lam_exact,
            p_offload=p,
            mean_offloaded_tokens=off.mean_tokens,
            mean_local_tokens=loc.mean_tokens,
            ttft_mean_s=latency_mean(s.lengths, routes),
            ttft_p90_s=latency_quantile(s.lengths, routes, 0.9),
            egress_gbps=egress,
            num_gpus=gpus_remote + gpus_local,
            cost_units=gpus_remote * s.price_ratio + gpus_local,
        )

    def _check(
        self, ts: np.ndarray, lam: np.ndarray, i: int, n_p: int, plan: DeploymentPlan
    ) -> OptimalityCheck:
        s = self.scenario
        p = plan.p_offload
        remote_rps = plan.theta_prfaas / p if p > 0 else math.inf
        local_rps = plan.theta_pdp / (1 - p) if p < 1 else math.inf
        # Eq. 7: the remote and local bounds cross within one grid step of the optimum.
        signs = []
        for j in (max(0, i - 1), i, min(len(ts) - 1, i + 1)):
            off = offload_moments(s.lengths, self.remote, ts[j], exact=False)
            loc = local_moments(s.lengths, self.local, ts[j], exact=False)
            r = theta_prfaas(off, s.n_prfaas, s.link_bytes_per_s) / off.share if off.share else 0
            q = theta_pdp(loc, n_p) / (1 - off.share) if off.share < 1 else 0
            signs.append(np.sign(r - q))
        eq7 = bool(min(signs) <= 0 <= max(signs))
        prefill_rps = plan.theta_prfaas + plan.theta_pdp
        per_d = self._theta_pdd(1)
        per_p = plan.theta_pdp / n_p if n_p else 0.0
        eq8 = abs(prefill_rps - plan.theta_pdd) <= max(per_d, per_p) + 1e-9
        return OptimalityCheck(remote_rps, local_rps, eq7, prefill_rps, plan.theta_pdd, eq8)

    # -- Fig. 5 --------------------------------------------------------------------------------
    def figure5(self, result: PlanResult) -> dict[str, np.ndarray]:
        """Fig. 5: Lambda vs t at the best split; per N_p, the prefill bound (at its own best t)
        and the decode bound, whose crossing is Eq. 8's optimum."""
        ts, prefill, decode = self.bounds_grid()
        lam = np.minimum(prefill, decode[None, :])
        n_ps = np.arange(1, self.scenario.n_local)
        return {
            "thresholds": ts,
            "lambda_vs_t": lam[:, result.prfaas.n_p],
            "n_p": n_ps.astype(np.float64),
            "prefill_bound": prefill[:, 1:].max(axis=0),
            "decode_bound": decode[1:],
        }


def plan(scenario: Scenario | None = None, threshold_tokens: int | None = None) -> PlanResult:
    return Planner(scenario or Scenario()).plan(threshold_tokens)
