"""workload: what arrives and when: arrival processes, prompt-length distributions, trace readers.

Pure: no torch, no asyncio, no clock reads. Randomness comes from a seeded ``random.Random`` passed
in. The only I/O is the explicit trace reader (``read_mooncake``).
"""

# The one length-distribution type lives in analytic (the planner reads the same objects).
from prfaas.analytic.lengths import (
    EmpiricalLengths,
    FixedLengths,
    LengthDistribution,
    TruncatedLogNormal,
)
from prfaas.workload.arrivals import (
    ARRIVAL_KINDS,
    ArrivalSpec,
    arrival_times,
)
from prfaas.workload.mooncake import TraceError, TraceRecord, read_mooncake
from prfaas.workload.requests import SimRequestSpec, synthetic_requests, trace_requests

__all__ = [
    "ARRIVAL_KINDS",
    "ArrivalSpec",
    "EmpiricalLengths",
    "FixedLengths",
    "LengthDistribution",
    "SimRequestSpec",
    "TraceError",
    "TraceRecord",
    "TruncatedLogNormal",
    "arrival_times",
    "read_mooncake",
    "synthetic_requests",
    "trace_requests",
]
