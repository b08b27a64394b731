"""sim: the discrete-event simulator of PrfaaS deployments; drives the ``policy/`` objects.

Pure: no torch, no asyncio, no clock reads; the only I/O is the trace reader it is pointed at.
"""

from prfaas.sim.maxrate import MaxRateResult, MaxRateRule, find_max_rate
from prfaas.sim.report import summary
from prfaas.sim.scenario import (
    DEPLOYMENTS,
    LengthConfig,
    LinkConfig,
    ScenarioError,
    SimScenario,
    SimSite,
    paper_deployment,
)
from prfaas.sim.simulator import Simulator

__all__ = [
    "DEPLOYMENTS",
    "LengthConfig",
    "LinkConfig",
    "MaxRateResult",
    "MaxRateRule",
    "ScenarioError",
    "SimScenario",
    "SimSite",
    "Simulator",
    "find_max_rate",
    "paper_deployment",
    "summary",
]
