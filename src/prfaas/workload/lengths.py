"""Prompt-length distributions: the paper's truncated log-normal, an empirical one, a fixed one.

``sample(rng)`` draws one length. ``stratified(rng, n)`` draws ``n`` lengths whose empirical CDF
matches the distribution closely in every block of ``block`` draws (one uniform per stratum
``[(j + U)/block)``, shuffled): the simulator uses it when it must reproduce the analytic model's
capacity, so that a few thousand requests carry the distribution's mean service time to a fraction
of a percent instead of the ~1% noise of plain sampling. Pure: randomness is passed in.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from statistics import NormalDist

_STD = NormalDist()


@functools.lru_cache(maxsize=64)
def _bounds(mu: float, sigma: float, lo: int, hi: int) -> tuple[float, float]:
    """CDF of the untruncated log-normal at the truncation points (cached: a hot path)."""
    return (_STD.cdf((math.log(lo) - mu) / sigma), _STD.cdf((math.log(hi) - mu) / sigma))


@dataclass(frozen=True, slots=True)
class TruncatedLogNormal:
    """``exp(N(mu, sigma^2))`` conditioned on ``[min_tokens, max_tokens]``, rounded to tokens."""

    mu: float = 9.90
    sigma: float = 1.00
    min_tokens: int = 128
    max_tokens: int = 131072

    def __post_init__(self) -> None:
        if not self.sigma > 0:
            raise ValueError(f"log-normal sigma must be > 0, got {self.sigma}")
        if not 0 < self.min_tokens < self.max_tokens:
            raise ValueError(
                f"need 0 < min_tokens < max_tokens, got [{self.min_tokens}, {self.max_tokens}]"
            )

    def _cdf_bounds(self) -> tuple[float, float]:
        lo = _STD.cdf((math.log(self.min_tokens) - self.mu) / self.sigma)
        hi = _STD.cdf((math.log(self.max_tokens) - self.mu) / self.sigma)
        return lo, hi

    def quantile(self, u: float) -> int:
        """The length at probability ``u`` in [0, 1] of the truncated distribution."""
        lo, hi = _bounds(self.mu, self.sigma, self.min_tokens, self.max_tokens)
        p = min(max(lo + u * (hi - lo), 1e-15), 1 - 1e-15)
        tokens = round(math.exp(self.mu + self.sigma * _STD.inv_cdf(p)))
        return min(max(tokens, self.min_tokens), self.max_tokens)

    def sample(self, rng: random.Random) -> int:
        return self.quantile(rng.random())

    def stratified(self, rng: random.Random, block: int = 1000) -> Iterator[int]:
        return _stratified(self.quantile, rng, block)


@dataclass(frozen=True, slots=True)
class EmpiricalLengths:
    """Draws uniformly from observed lengths (e.g. a trace's prompt lengths)."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("an empirical length distribution needs at least one value")
        if min(self.values) <= 0:
            raise ValueError(f"lengths must be > 0 tokens, got {min(self.values)}")

    @classmethod
    def of(cls, values: Sequence[int]) -> EmpiricalLengths:
        return cls(tuple(sorted(int(v) for v in values)))

    def quantile(self, u: float) -> int:
        return self.values[min(int(u * len(self.values)), len(self.values) - 1)]

    def sample(self, rng: random.Random) -> int:
        return self.quantile(rng.random())

    def stratified(self, rng: random.Random, block: int = 1000) -> Iterator[int]:
        return _stratified(self.quantile, rng, block)


@dataclass(frozen=True, slots=True)
class FixedLengths:
    tokens: int

    def __post_init__(self) -> None:
        if self.tokens <= 0:
            raise ValueError(f"a fixed length must be > 0 tokens, got {self.tokens}")

    def quantile(self, u: float) -> int:
        return self.tokens

    def sample(self, rng: random.Random) -> int:
        return self.tokens

    def stratified(self, rng: random.Random, block: int = 1000) -> Iterator[int]:
        while True:
            yield self.tokens


def _stratified(quantile: object, rng: random.Random, block: int) -> Iterator[int]:
    assert callable(quantile)
    if block <= 0:
        raise ValueError(f"stratification block must be > 0, got {block}")
    while True:
        us = [(j + rng.random()) / block for j in range(block)]
        rng.shuffle(us)
        for u in us:
            yield quantile(u)
