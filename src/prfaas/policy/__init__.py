"""policy: THE decision code shared by the simulator and the live gateway.

Pure and synchronous: decisions are functions of immutable observations (a ``RequestView``, a
``ClusterView``, ``now``) returning frozen dataclasses. No torch, no asyncio, no clock reads, no
I/O, and no import of ``prfaas.sim`` or ``prfaas.serve``.
"""

from prfaas.policy.batching import DecodeAdmission, PrefillBatcher
from prfaas.policy.capacity import CapacityPoint, SampleCapacity
from prfaas.policy.control import ControlAction, ControlPolicy, SetThreshold, control_policy
from prfaas.policy.decisions import (
    AdmitDecision,
    CacheMove,
    PrefillBatch,
    RebalancePlan,
    RoleChange,
    RouteDecision,
    ThresholdUpdate,
)
from prfaas.policy.placement import DecodePlacement, IndexedClusterView, least_loaded
from prfaas.policy.router import (
    ROUTER_NAMES,
    BandwidthAwareRouter,
    BandwidthRules,
    LocalOnlyRouter,
    NaiveRouter,
    NoRouteError,
    Router,
    ThresholdRouter,
    make_router,
)
from prfaas.policy.tuning import Rebalancer, ThresholdTuner, TuningConfig
from prfaas.policy.window import LengthWindow

__all__ = [
    "ROUTER_NAMES",
    "AdmitDecision",
    "BandwidthAwareRouter",
    "BandwidthRules",
    "CacheMove",
    "CapacityPoint",
    "ControlAction",
    "ControlPolicy",
    "DecodeAdmission",
    "DecodePlacement",
    "IndexedClusterView",
    "LengthWindow",
    "LocalOnlyRouter",
    "NaiveRouter",
    "NoRouteError",
    "PrefillBatch",
    "PrefillBatcher",
    "RebalancePlan",
    "Rebalancer",
    "RoleChange",
    "RouteDecision",
    "Router",
    "SampleCapacity",
    "SetThreshold",
    "ThresholdRouter",
    "ThresholdTuner",
    "ThresholdUpdate",
    "TuningConfig",
    "control_policy",
    "least_loaded",
    "make_router",
]
