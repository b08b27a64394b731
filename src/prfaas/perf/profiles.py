"""Shipped measured profiles: (model, hardware) -> prefill curve and decode constants.

Each entry says where its numbers come from. Entries marked ASSUMPTION were inferred, not measured
(PAPER.md, "Constants the paper does not publish"). Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.perf.curves import PiecewiseLinearCurve, PolynomialCurve


@dataclass(frozen=True, slots=True)
class DecodeProfile:
    """Decode of one instance at its SLO operating point.

    ``step_s`` is the per-step time for any batch up to ``max_batch`` (a memory-bound step whose
    weight reads dominate, so the paper treats it as flat); a larger batch is charged
    proportionally (``step_s * batch / max_batch``), i.e. it breaks the SLO.
    """

    step_s: float
    max_batch: int
    note: str


@dataclass(frozen=True, slots=True)
class Profile:
    model: str
    hardware: str
    prefill: PiecewiseLinearCurve | PolynomialCurve | None
    decode: DecodeProfile | None
    note: str


PROFILES: dict[tuple[str, str], Profile] = {
    ("paper-1t", "h200"): Profile(
        "paper-1t",
        "h200",
        # MEASURED (by the paper's authors): Table 5, one 8xH200 instance, SGLang v0.5.9.
        PiecewiseLinearCurve.of([(1024, 0.44), (8192, 0.72), (32768, 1.84), (131072, 7.40)]),
        None,
        "paper Table 5 (8xH200), linear interpolation between its four points",
    ),
    ("paper-1t", "h20"): Profile(
        "paper-1t",
        "h20",
        # ASSUMPTION: inferred in PAPER.md from Table 6 (its mean over the workload, 4.447 s,
        # matches the homogeneous mean TTFT of 4.44 s).
        PolynomialCurve((0.4691, 1.3004e-4, 2.940e-10)),
        # ASSUMPTION: the 40 tok/s SLO gives 25 ms steps; BS_max = 20 reproduces Table 6's
        # Theta_pdd (0.78125 req/s per instance at 1024 output tokens).
        DecodeProfile(0.025, 20, "ASSUMPTION inferred from Table 6: 25 ms steps, BS_max 20"),
        "ASSUMPTION: H20 curve and decode constants inferred from paper Table 6",
    ),
}


def find_profile(model: str, hardware: str) -> Profile | None:
    return PROFILES.get((model, hardware))
