"""Profiles: (model, hardware) -> prefill curve and decode model, and the shipped ones.

The shipped profiles are profile files (``perf/data/<model>@<hardware>.yaml``, the format of
``perf.profile_file``; ``perf.profile_read.shipped_profiles`` reads them once on first use);
each says where its numbers come from. Entries marked ASSUMPTION were inferred, not measured
(PAPER.md, "Constants the paper does not publish").
Pure: the only I/O is reading this package's own data files.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from prfaas.perf.curves import PiecewiseLinearCurve, PolynomialCurve
from prfaas.perf.prefill_fit import PrefillFit

SHIPPED_PROFILE_NAMES: tuple[str, ...] = ("paper-1t@h200", "paper-1t@h20")
"""The files under ``perf/data``: ``prfaas profile --preset NAME`` writes one of them."""


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
class DecodeFit:
    """A measured decode step: ``base_s + per_request_s * batch + per_token_s * context``.

    ``context`` is the batch's total context tokens; fitted to a profile's decode points.
    """

    base_s: float
    per_request_s: float
    per_token_s: float
    note: str


@dataclass(frozen=True, slots=True)
class Profile:
    model: str
    hardware: str
    prefill: PiecewiseLinearCurve | PolynomialCurve | None
    decode: DecodeProfile | DecodeFit | None
    note: str
    source: str | None = None
    """What a cost model built on it reports (e.g. ``profile-file:<path>``); None: the built-in
    ``profile:<model>@<hardware>``."""
    prefill_fit: PrefillFit | None = None
    """The prefill's cost per pass, per token and per attended pair fitted over the measured
    points (``perf.prefill_fit``): it prices every prefill where the profile knows its passes,
    a cached prefix's attention otherwise. None: the curve alone (its rule for a prefix)."""


def shipped_profile_text(name: str) -> str:
    """The YAML text of the shipped profile ``name`` (``model@hardware``); KeyError if none."""
    if name not in SHIPPED_PROFILE_NAMES:
        raise KeyError(
            f"unknown shipped profile {name!r} (known: {', '.join(SHIPPED_PROFILE_NAMES)})"
        )
    return (resources.files("prfaas.perf") / "data" / f"{name}.yaml").read_text(encoding="utf-8")
