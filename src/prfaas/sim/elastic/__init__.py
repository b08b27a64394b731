"""sim.elastic: the elastic-pool simulator. A PrfaaS pool behind one admission queue whose nodes
start (``startup_s``), serve, drain and are preempted (spot, with notice), sized by the same
``policy.Autoscaler`` the live provider drives; it reports node-hours, $ and TTFT attainment.
Pure (no clock, no I/O); imports ``core``, ``perf``, ``analytic.prices``, ``policy``."""

from prfaas.sim.elastic.config import (
    ElasticScenario,
    GroupConfig,
    PreemptionConfig,
    parse_availability,
)
from prfaas.sim.elastic.load import Arrival, RateProfile, warp
from prfaas.sim.elastic.report import ElasticReport, ScaleEvent
from prfaas.sim.elastic.simulator import ElasticSim
from prfaas.sim.elastic.wall_clock import in_modelled_seconds

__all__ = [
    "Arrival",
    "ElasticReport",
    "ElasticScenario",
    "ElasticSim",
    "GroupConfig",
    "PreemptionConfig",
    "RateProfile",
    "ScaleEvent",
    "in_modelled_seconds",
    "parse_availability",
    "warp",
]
