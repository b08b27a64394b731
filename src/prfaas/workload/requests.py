"""Streams of requests for the simulator: synthetic (arrival process x length distribution) or a
trace replay (optionally time-scaled). Pure and lazy: a million-request run never holds them all.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prfaas.analytic.lengths import LengthDistribution
from prfaas.workload.arrivals import ArrivalSpec, arrival_times
from prfaas.workload.mooncake import TraceRecord


@dataclass(frozen=True, slots=True)
class SimRequestSpec:
    """One request as the workload produces it (before any serving state exists)."""

    index: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    block_hashes: tuple[int, ...] = ()
    """Chained hashes of the prompt's full blocks (empty: no prefix sharing)."""
    home_site: int = 0
    """Index of the PD site the request enters at (several PD sites share PrfaaS sites)."""


def synthetic_requests(
    arrivals: ArrivalSpec,
    lengths: LengthDistribution,
    num_output_tokens: int,
    duration_s: float,
    rng: random.Random,
    *,
    stratified: bool = False,
    num_home_sites: int = 1,
) -> Iterator[SimRequestSpec]:
    """Requests with lengths from ``lengths`` at times from ``arrivals``; no shared prefixes.

    Arrival times and lengths use independent streams derived from ``rng`` so changing the rate
    keeps the same sequence of lengths (common random numbers across a rate search).
    """
    if num_output_tokens <= 0:
        raise ValueError(f"output length must be > 0 tokens, got {num_output_tokens}")
    if num_home_sites <= 0:
        raise ValueError(f"need at least one PD site, got {num_home_sites}")
    time_rng = random.Random(rng.getrandbits(64))
    length_rng = random.Random(rng.getrandbits(64))
    length_iter = lengths.stratified(length_rng) if stratified else None
    for i, t in enumerate(arrival_times(arrivals, duration_s, time_rng)):
        n = next(length_iter) if length_iter is not None else lengths.draw(length_rng)
        yield SimRequestSpec(i, t, n, num_output_tokens, (), i % num_home_sites)


def trace_requests(
    records: Iterable[TraceRecord],
    *,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
    num_home_sites: int = 1,
    max_prompt_tokens: int | None = None,
) -> Iterator[SimRequestSpec]:
    """Replay trace records; ``rate_scale`` 2 compresses time so requests arrive twice as fast.
    ``max_prompt_tokens``: a longer prompt is cut to it (the model's context: the same cut as
    ``EmpiricalLengths.capped``; its block hashes are cut with it)."""
    if not rate_scale > 0:
        raise ValueError(f"rate scale must be > 0, got {rate_scale}")
    for i, rec in enumerate(records):
        t = rec.arrival_s / rate_scale
        if duration_s is not None and t >= duration_s:
            return
        n, hashes = rec.num_prompt_tokens, rec.block_hashes
        if max_prompt_tokens is not None and n > max_prompt_tokens:
            keep = len(hashes) * max_prompt_tokens // n  # whole blocks still inside the cut
            n, hashes = max_prompt_tokens, hashes[:keep]
        yield SimRequestSpec(i, t, n, rec.num_output_tokens, hashes, i % num_home_sites)
