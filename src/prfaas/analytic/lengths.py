"""Prompt-length distributions: the ONE type the planner, the simulator, the online policies and
the load generator share (``workload`` re-exports them; there is no second copy).

``TruncatedLogNormal`` (the paper's workload), ``EmpiricalLengths`` (observed lengths, e.g. a
trace's prompts) and ``FixedLengths``. The analytic side: ``P(L <= x)`` and ``E[L; a < L <= b]``
in closed form (normal CDFs, exact sums), ``E[f(L); a < L <= b]`` by adaptive quadrature (scipy)
or exact sums, never by sampling; numpy arrays for ``x`` so the planner's grid search over
thresholds is vectorised; ``sample(np_rng, n)``. The drawing side (the simulator's requests):
``token_at(u)`` the length at probability ``u``, ``draw(rng)`` one length from a seeded
``random.Random``, and ``stratified(rng, n)``: lengths whose empirical CDF matches the
distribution closely in every block of ``block`` draws (one uniform per stratum ``[(j + U)/block)``,
shuffled), used when the simulator must reproduce the analytic model's capacity, so that a few
thousand requests carry the distribution's mean service time to a fraction of a percent instead of
the ~1% noise of plain sampling. ``capped(max_tokens)``: the same workload cut to a model's
context (``scenarios.workload_lengths`` says so with a warning).
Pure: numpy/scipy only; randomness passed in; no I/O.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import integrate, special  # type: ignore[import-untyped]

FloatArray = NDArray[np.float64]
_STD = NormalDist()


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

    def token_at(self, u: float) -> int:
        """The length (tokens) at probability ``u`` in [0, 1]."""
        ...

    def draw(self, rng: random.Random) -> int: ...

    def stratified(self, rng: random.Random, block: int = 1000) -> Iterator[int]: ...

    def capped(self, max_tokens: int) -> LengthDistribution:
        """The same workload with no prompt longer than ``max_tokens``."""
        ...


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
    _u_lo: float = field(init=False, repr=False)
    _u_hi: float = field(init=False, repr=False)

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
        # The drawing side uses the standard library's normal (the simulator's hot path: no numpy
        # call per request, and the same lengths as before the two types were merged).
        object.__setattr__(self, "_u_lo", _STD.cdf(z_lo))
        object.__setattr__(self, "_u_hi", _STD.cdf(z_hi))

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

    def token_at(self, u: float) -> int:
        lo = self._u_lo
        p = min(max(lo + u * (self._u_hi - lo), 1e-15), 1 - 1e-15)
        tokens = round(math.exp(self.mu + self.sigma * _STD.inv_cdf(p)))
        return min(max(tokens, self.lo), self.hi)

    def draw(self, rng: random.Random) -> int:
        return self.token_at(rng.random())

    def stratified(self, rng: random.Random, block: int = 1000) -> Iterator[int]:
        return _stratified(self.token_at, rng, block)

    def capped(self, max_tokens: int) -> LengthDistribution:
        if max_tokens >= self.hi:
            return self
        if max_tokens <= self.lo:
            return FixedLengths(max_tokens)
        return TruncatedLogNormal(self.mu, self.sigma, self.lo, max_tokens)


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
        self.values: tuple[int, ...] = tuple(int(v) for v in values)
        """The lengths, sorted (the drawing side indexes them)."""

    @classmethod
    def of(cls, values: Sequence[int], label: str = "empirical") -> EmpiricalLengths:
        return cls(values, label)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EmpiricalLengths) and self.values == other.values

    def __hash__(self) -> int:
        return hash(self.values)

    def __repr__(self) -> str:
        return f"EmpiricalLengths({self.describe()})"

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

    def token_at(self, u: float) -> int:
        v = self.values
        return v[min(int(u * len(v)), len(v) - 1)]

    def draw(self, rng: random.Random) -> int:
        return self.token_at(rng.random())

    def stratified(self, rng: random.Random, block: int = 1000) -> Iterator[int]:
        return _stratified(self.token_at, rng, block)

    def capped(self, max_tokens: int) -> LengthDistribution:
        """Each observed prompt longer than ``max_tokens`` cut to it (a client truncates)."""
        if max_tokens >= self.max_tokens:
            return self
        return EmpiricalLengths([min(v, max_tokens) for v in self.values], self._label)


@dataclass(frozen=True, slots=True)
class FixedLengths:
    """Every prompt ``tokens`` long."""

    tokens: int

    def __post_init__(self) -> None:
        if self.tokens <= 0:
            raise ValueError(f"a fixed length must be > 0 tokens, got {self.tokens}")

    @property
    def min_tokens(self) -> int:
        return self.tokens

    @property
    def max_tokens(self) -> int:
        return self.tokens

    def cdf(self, x: ArrayLike) -> FloatArray:
        return np.asarray(np.asarray(x, dtype=np.float64) >= self.tokens, dtype=np.float64)

    def partial_mean(self, lo: ArrayLike, hi: ArrayLike) -> FloatArray:
        inside = (np.asarray(lo, dtype=np.float64) < self.tokens) & (
            self.tokens <= np.asarray(hi, dtype=np.float64)
        )
        return np.asarray(np.where(inside, float(self.tokens), 0.0), dtype=np.float64)

    def partial_expect(self, fn: Callable[[float], float], lo: float, hi: float) -> float:
        return fn(float(self.tokens)) if lo < self.tokens <= hi else 0.0

    def quantile(self, q: float) -> float:
        if not 0 <= q <= 1:
            raise ValueError(f"quantile level must be in [0, 1], got {q}")
        return float(self.tokens)

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        return np.full(n, self.tokens, dtype=np.int64)

    def describe(self) -> str:
        return f"fixed {self.tokens} tokens"

    def token_at(self, u: float) -> int:
        return self.tokens

    def draw(self, rng: random.Random) -> int:
        return self.tokens

    def stratified(self, rng: random.Random, block: int = 1000) -> Iterator[int]:
        while True:
            yield self.tokens

    def capped(self, max_tokens: int) -> LengthDistribution:
        return self if max_tokens >= self.tokens else FixedLengths(max_tokens)


def _stratified(token_at: Callable[[float], int], rng: random.Random, block: int) -> Iterator[int]:
    if block <= 0:
        raise ValueError(f"stratification block must be > 0, got {block}")
    while True:
        us = [(j + rng.random()) / block for j in range(block)]
        rng.shuffle(us)
        for u in us:
            yield token_at(u)


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


def cut_to_context(
    dist: LengthDistribution, context_tokens: int, what: str
) -> tuple[LengthDistribution, str | None]:
    """THE rule for a model whose context is shorter than the workload (plan, sim and the
    gateway's ``t``): every prompt longer than ``context_tokens`` is cut to it (``capped``), and
    the returned warning (None when nothing was cut) says how many. ``what`` names the workload
    and the model in the warning."""
    if dist.max_tokens <= context_tokens:
        return dist, None
    share = float(1.0 - dist.cdf(context_tokens))
    warning = (
        f"{what}: prompts up to {dist.max_tokens} tokens exceed the model's context of "
        f"{context_tokens} tokens; {100 * share:.1f}% of prompts are cut to {context_tokens} "
        "tokens (plan, sim and the gateway's t all use the cut lengths)"
    )
    return dist.capped(context_tokens), warning
