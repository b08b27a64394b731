"""Prompt-length distributions, re-exported: the one type lives in ``analytic/lengths.py`` (the
planner, the simulator, the online policies and the load generator read the same objects; there
is no second log-normal or empirical copy here). Pure."""

from prfaas.analytic.lengths import (
    EmpiricalLengths,
    FixedLengths,
    LengthDistribution,
    TruncatedLogNormal,
)

__all__ = ["EmpiricalLengths", "FixedLengths", "LengthDistribution", "TruncatedLogNormal"]
