"""perf: the cost model, the single source of timing for planner, simulator and timed engine.

Pure: imports ``spec`` only; no I/O, no clock, no torch, no asyncio.
"""

from prfaas.perf.cost_model import CostModel, cost_model_for
from prfaas.perf.curves import PiecewiseLinearCurve, PolynomialCurve
from prfaas.perf.profiles import PROFILES, DecodeProfile, Profile, find_profile
from prfaas.perf.roofline import Roofline, prefill_flops

__all__ = [
    "PROFILES",
    "CostModel",
    "DecodeProfile",
    "PiecewiseLinearCurve",
    "PolynomialCurve",
    "Profile",
    "Roofline",
    "cost_model_for",
    "find_profile",
    "prefill_flops",
]
