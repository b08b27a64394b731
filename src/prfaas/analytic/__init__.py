"""analytic: the paper's steady-state throughput model (Eqs. 1-8), its grid search and TTFT.

Pure: imports ``spec`` and ``perf``, numpy and scipy; no I/O, no clock, no torch, no asyncio.
"""

from prfaas.analytic.lengths import (
    EmpiricalLengths,
    FixedLengths,
    LengthDistribution,
    TruncatedLogNormal,
    mean,
    mean_above,
    mean_at_or_below,
    prob_above,
)
from prfaas.analytic.planner import (
    DecodePoint,
    DeploymentPlan,
    OptimalityCheck,
    Planner,
    PlanResult,
    plan,
)
from prfaas.analytic.scenario import Scenario
from prfaas.analytic.throughput import phi_kv_gbps, required_egress_gbps

__all__ = [
    "DecodePoint",
    "DeploymentPlan",
    "EmpiricalLengths",
    "FixedLengths",
    "LengthDistribution",
    "OptimalityCheck",
    "PlanResult",
    "Planner",
    "Scenario",
    "TruncatedLogNormal",
    "mean",
    "mean_above",
    "mean_at_or_below",
    "phi_kv_gbps",
    "plan",
    "prob_above",
    "required_egress_gbps",
]
