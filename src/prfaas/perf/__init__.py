"""perf: the cost model, the single source of timing for planner, simulator and timed engine.

Pure: imports ``spec`` only; no clock, no torch, no asyncio; the only I/O is reading and writing
profile files (``profile_read``, ``profile_write``), asked for explicitly, and reading the
package's shipped ones.
"""

from prfaas.perf.cost_model import CostModel, cost_model_for
from prfaas.perf.curves import PiecewiseLinearCurve, PolynomialCurve
from prfaas.perf.profile_costs import cost_model_for_hardware, cost_model_from_profile_file
from prfaas.perf.profile_file import ProfileFile, ProfileFileError, is_profile_file
from prfaas.perf.profile_read import find_profile, load_profile_file, shipped_profiles
from prfaas.perf.profiles import DecodeFit, DecodeProfile, Profile
from prfaas.perf.roofline import Roofline, prefill_flops

__all__ = [
    "CostModel",
    "DecodeFit",
    "DecodeProfile",
    "PiecewiseLinearCurve",
    "PolynomialCurve",
    "Profile",
    "ProfileFile",
    "ProfileFileError",
    "Roofline",
    "cost_model_for",
    "cost_model_for_hardware",
    "cost_model_from_profile_file",
    "find_profile",
    "is_profile_file",
    "load_profile_file",
    "prefill_flops",
    "shipped_profiles",
]
