"""core: the shared vocabulary of prfaas (ids, requests, topology, clocks, policy views, the
congestion rule).

Pure: no I/O, no torch, no asyncio. Every other package imports from here; this package imports
from nothing else in prfaas.
"""

from prfaas.core.clock import Clock, LoopClock, VirtualClock
from prfaas.core.congestion import CongestionRule
from prfaas.core.ids import LinkId, NodeId, RequestId, SiteId
from prfaas.core.request import (
    TERMINAL_STATES,
    InvalidTransition,
    RequestLifecycle,
    RequestState,
    can_transition,
)
from prfaas.core.topology import NodeRole, SiteKind
from prfaas.core.views import (
    ClusterView,
    LinkState,
    MutableClusterView,
    NodeLoad,
    RequestView,
)

__all__ = [
    "TERMINAL_STATES",
    "Clock",
    "ClusterView",
    "CongestionRule",
    "InvalidTransition",
    "LinkId",
    "LinkState",
    "LoopClock",
    "MutableClusterView",
    "NodeId",
    "NodeLoad",
    "NodeRole",
    "RequestId",
    "RequestLifecycle",
    "RequestState",
    "RequestView",
    "SiteId",
    "SiteKind",
    "VirtualClock",
    "can_transition",
]
