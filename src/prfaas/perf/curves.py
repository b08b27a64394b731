"""Latency curves: a seconds-versus-tokens function built from measured points or a polynomial.

``PiecewiseLinearCurve`` interpolates linearly between measured points and extends the first and
last segments beyond them (so ``T(0)`` is the first segment's intercept: the fixed per-request
overhead). ``PolynomialCurve`` evaluates ``c0 + c1*l + c2*l^2 + ...``. Pure: no I/O.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PiecewiseLinearCurve:
    points: tuple[tuple[float, float], ...]
    """(tokens, seconds) pairs with strictly increasing tokens; at least two."""
    _xs: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _segments: tuple[tuple[float, float, float, float], ...] = field(
        init=False, repr=False, compare=False
    )
    """Per segment ``(x0, y0, y1 - y0, x1 - x0)``: the differences ``__call__`` takes, taken
    once (the same floats, so the same results; the simulator calls it per request)."""

    def __post_init__(self) -> None:
        if len(self.points) < 2:
            raise ValueError("a piecewise-linear curve needs at least two points")
        xs = tuple(x for x, _ in self.points)
        if any(b <= a for a, b in itertools.pairwise(xs)):
            raise ValueError(f"curve points must have strictly increasing lengths: {xs}")
        object.__setattr__(self, "_xs", xs)  # the simulator calls this per request: no rebuild
        segments = tuple(
            (x0, y0, y1 - y0, x1 - x0) for (x0, y0), (x1, y1) in itertools.pairwise(self.points)
        )
        object.__setattr__(self, "_segments", segments)

    @classmethod
    def of(cls, points: Sequence[tuple[float, float]]) -> PiecewiseLinearCurve:
        return cls(tuple((float(x), float(y)) for x, y in points))

    def __call__(self, tokens: float) -> float:
        segments = self._segments
        i = bisect.bisect_right(self._xs, tokens) - 1
        # Extend the end segments beyond the measured range.
        if i < 0:
            i = 0
        elif i >= len(segments):
            i = len(segments) - 1
        x0, y0, dy, dx = segments[i]
        return y0 + dy * (tokens - x0) / dx

    def describe(self) -> str:
        return "piecewise-linear over " + ", ".join(f"{x:g}:{y:g}s" for x, y in self.points)


@dataclass(frozen=True, slots=True)
class PolynomialCurve:
    coefficients: tuple[float, ...]
    """c0, c1, c2, ...: seconds = sum(c_i * tokens**i)."""

    def __post_init__(self) -> None:
        if not self.coefficients:
            raise ValueError("a polynomial curve needs at least one coefficient")

    def __call__(self, tokens: float) -> float:
        result = 0.0
        for c in reversed(self.coefficients):
            result = result * tokens + c
        return result

    def describe(self) -> str:
        return " + ".join(f"{c:.4g}*l^{i}" for i, c in enumerate(self.coefficients))
