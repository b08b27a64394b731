"""Prompt-length distributions with exact conditional moments.

``TruncatedLogNormal`` answers ``P(L <= x)`` and ``E[L; a < L <= b]`` in closed form (normal CDFs)
and ``E[f(L); a < L <= b]`` by adaptive quadrature (scipy), never by sampling. ``EmpiricalLengths``
holds observed lengths (e.g. a trace) and answers the same questions with exact sums. Both accept
numpy arrays for ``x`` so the planner's grid search over thresholds is vectorised.
Pure: numpy/scipy only; no I/O.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import integrate, special  # type: ignore[import-untyped]

FloatArray = NDArray[np.float64]


class LengthDistribution(Protocol):
    @property
    def min_tokens(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    def cdf(self, x: ArrayLike) -> FloatArray:
        """P(L <= x)."""
        ...

    def partial_mean(self, lo: ArrayLike, hi: ArrayLike) -> FloatArray:
        """E[L; lo < L <= hi] (not normalised)."""
        ...

    def partial_expect(self, fn: Callable[[float], float], lo: float, hi: float) -> float:
        """E[fn(L); lo < L <= hi] (not normalised)."""
        ...

    def quantile(self, q: float) -> float: ...

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]: ...

    def describe(self) -> str: ...


def _phi(z: ArrayLike) -> FloatArray:
    return np.asarray(special.ndtr(z), dtype=np.float64)


@dataclass(frozen=True)
class TruncatedLogNormal:
    """ln L ~ Normal(mu, sigma), truncated to [lo, hi] tokens."""

    mu: float = 9.90
    sigma: float = 1.00
    lo: int = 128
    hi: int = 131072
    _z_lo: float = field(init=False, repr=False)
    _z_hi: float = field(init=False, repr=False)
    _mass: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if not 0 < self.lo < self.hi:
            raise ValueError(f"need 0 < lo < hi, got lo={self.lo} hi={self.hi}")
        z_lo = (math.log(self.lo) - self.mu) / self.sigma
        z_hi = (math.log(self.hi) - self.mu) / self.sigma
        mass = float(special.ndtr(z_hi) - special.ndtr(z_lo))
        if mass < 1e-12:
            raise ValueError(
                f"log-normal(mu={self.mu}, sigma={self.sigma}) "
                f"puts no mass on [{self.lo}, {self.hi}]"
            )
        object.__setattr__(self, "_z_lo", z_lo)
        object.__setattr__(self, "_z_hi", z_hi)
        object.__setattr__(self, "_mass", mass)

    @property
    def min_tokens(self) -> int:
        return self.lo

    @property
    def max_tokens(self) -> int:
        return self.hi

    def _z(self, x: ArrayLike) -> FloatArray:
        xa = np.clip(np.asarray(x, dtype=np.float64), self.lo, self.hi)
        return np.asarray((np.log(xa) - self.mu) / self.sigma, dtype=np.float64)

    def cdf(self, x: ArrayLike) -> FloatArray:
        return np.asarray((_phi(self._z(x)) - _phi(self._z_lo)) / self._mass, dtype=np.float64)

    def partial_mean(self, lo: ArrayLike, hi: ArrayLike) -> FloatArray:
        # E[L; L <= x] for a log-normal = exp(mu + s^2/2) * Phi(z(x) - s), z standardised.
        s = self.sigma
        scale = math.exp(self.mu + s * s / 2) / self._mass
        upper = _phi(self._z(hi) - s)
        lower = _phi(self._z(lo) - s)
        return np.asarray(scale * np.maximum(upper - lower, 0.0), dtype=np.float64)

    def pdf(self, x: float) -> float:
        if x < self.lo or x > self.hi:
            return 0.0
        z = (math.log(x) - self.mu) / self.sigma
        return math.exp(-0.5 * z * z) / (x * self.sigma * math.sqrt(2 * math.pi) * self._mass)

    def partial_expect(self, fn: Callable[[float], float], lo: float, hi: float) -> float:
        a, b = max(lo, self.lo), min(hi, self.hi)
        if b <= a:
            return 0.0

        def integrand(u: float) -> float:  # in log space: smooth, well scaled
            x = math.exp(u)
            return fn(x) * self.pdf(x) * x

        with warnings.catch_warnings():
            # quad warns about round-off once it is at machine precision; the value is still good.
            warnings.simplefilter("ignore", integrate.IntegrationWarning)
            value, _err = integrate.quad(
                integrand, math.log(a), math.log(b), limit=200, epsabs=0, epsrel=1e-9
            )
        return float(value)

    def quantile(self, q: float) -> float:
        if not 0 <= q <= 1:
            raise ValueError(f"quantile level must be in [0, 1], got {q}")
        target = _phi(self._z_lo) + q * self._mass
        z = float(special.ndtri(min(max(float(target), 1e-300), 1 - 1e-16)))
        return float(min(max(math.exp(self.mu + self.sigma * z), self.lo), self.hi))

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        u = rng.uniform(_phi(self._z_lo), _phi(self._z_lo) + self._mass, size=n)
        x = np.exp(self.mu + self.sigma * special.ndtri(u))
        return np.asarray(np.clip(np.rint(x), self.lo, self.hi), dtype=np.int64)

    def describe(self) -> str:
        return f"truncated log-normal(mu={self.mu}, sigma={self.sigma}) on [{self.lo}, {self.hi}]"


class EmpiricalLengths:
    """Observed lengths, each with equal weight (a trace's prompts)."""

    def __init__(self, lengths: ArrayLike, label: str = "empirical") -> None:
        values = np.sort(np.asarray(lengths, dtype=np.float64))
        if values.size == 0:
            raise ValueError("an empirical length distribution needs at least one length")
        if values[0] <= 0:
            raise ValueError(f"lengths must be > 0, got {values[0]:g}")
        self._x = values
        self._cum_x = np.concatenate(([0.0], np.cumsum(values)))
        self._label = label

    @property
    def min_tokens(self) -> int:
        return int(self._x[0])

    @property
    def max_tokens(self) -> int:
        return int(self._x[-1])

    @property
    def num_samples(self) -> int:
        return int(self._x.size)

    def _count_le(self, x: ArrayLike) -> NDArray[np.int64]:
        found = np.searchsorted(self._x, np.asarray(x, dtype=np.float64), side="right")
        return np.asarray(found, dtype=np.int64)

    def cdf(self, x: ArrayLike) -> FloatArray:
        return np.asarray(self._count_le(x) / self._x.size, dtype=np.float64)

    def partial_mean(self, lo: ArrayLike, hi: ArrayLike) -> FloatArray:
        i, j = self._count_le(lo), self._count_le(hi)
        total = self._cum_x[np.maximum(j, i)] - self._cum_x[i]
        return np.asarray(total / self._x.size, dtype=np.float64)

    def partial_expect(self, fn: Callable[[float], float], lo: float, hi: float) -> float:
        i, j = int(self._count_le(lo)), int(self._count_le(hi))
        if j <= i:
            return 0.0
        return float(sum(fn(float(v)) for v in self._x[i:j]) / self._x.size)

    def quantile(self, q: float) -> float:
        if not 0 <= q <= 1:
            raise ValueError(f"quantile level must be in [0, 1], got {q}")
        return float(np.quantile(self._x, q, method="inverted_cdf"))

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        return np.asarray(rng.choice(self._x, size=n), dtype=np.int64)

    def describe(self) -> str:
        return f"{self._label} ({self._x.size} lengths, mean {self._x.mean():.0f})"


def prob_above(dist: LengthDistribution, t: ArrayLike) -> FloatArray:
    return np.asarray(1.0 - dist.cdf(t), dtype=np.float64)


def mean_above(dist: LengthDistribution, t: ArrayLike) -> FloatArray:
    """E[L | L > t] (nan where P(L > t) = 0)."""
    p = prob_above(dist, t)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(dist.partial_mean(t, dist.max_tokens) / p, dtype=np.float64)


def mean_at_or_below(dist: LengthDistribution, t: ArrayLike) -> FloatArray:
    """E[L | L <= t] (nan where P(L <= t) = 0)."""
    q = dist.cdf(t)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(dist.partial_mean(0, t) / q, dtype=np.float64)


def mean(dist: LengthDistribution) -> float:
    return float(dist.partial_mean(0, dist.max_tokens))
