"""Streams of requests for the simulator: synthetic (arrival process x length distribution) or a
trace replay (optionally time-scaled). Pure and lazy: a million-request run never holds them all.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prfaas.analytic.lengths import LengthDistribution
from prfaas.workload.arrivals import ArrivalSpec, arrival_times
from prfaas.workload.mooncake import TraceRecord, TraceRow


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


SpecRow = tuple[int, float, int, int, tuple[int, ...], int]
"""A ``SimRequestSpec``'s fields as a plain tuple ``(index, arrival_s, num_prompt_tokens,
num_output_tokens, block_hashes, home_site)``: what the simulator reads of its own workload (the
``*_rows`` generators below; a frozen dataclass per request cost as much as its whole arrival).
The ``*_requests`` generators yield the same requests as ``SimRequestSpec``s."""


def row_of(spec: SimRequestSpec) -> SpecRow:
    """``spec``'s fields as a ``SpecRow``."""
    return (spec.index, spec.arrival_s, spec.num_prompt_tokens, spec.num_output_tokens,
            spec.block_hashes, spec.home_site)  # fmt: skip


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
    for row in synthetic_rows(
        arrivals, lengths, num_output_tokens, duration_s, rng, stratified=stratified,
        num_home_sites=num_home_sites,
    ):  # fmt: skip
        yield SimRequestSpec(*row)


def synthetic_rows(
    arrivals: ArrivalSpec,
    lengths: LengthDistribution,
    num_output_tokens: int,
    duration_s: float,
    rng: random.Random,
    *,
    stratified: bool = False,
    num_home_sites: int = 1,
) -> Iterator[SpecRow]:
    """``synthetic_requests`` as ``SpecRow``s."""
    if num_output_tokens <= 0:
        raise ValueError(f"output length must be > 0 tokens, got {num_output_tokens}")
    if num_home_sites <= 0:
        raise ValueError(f"need at least one PD site, got {num_home_sites}")
    time_rng = random.Random(rng.getrandbits(64))
    length_rng = random.Random(rng.getrandbits(64))
    length_iter = lengths.stratified(length_rng) if stratified else None
    for i, t in enumerate(arrival_times(arrivals, duration_s, time_rng)):
        n = next(length_iter) if length_iter is not None else lengths.draw(length_rng)
        yield (i, t, n, num_output_tokens, (), i % num_home_sites)


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
    rows = (
        (r.line_number, r.arrival_s, r.num_prompt_tokens, r.num_output_tokens, r.block_hashes)
        for r in records
    )
    for row in trace_request_rows(
        rows, rate_scale=rate_scale, duration_s=duration_s, num_home_sites=num_home_sites,
        max_prompt_tokens=max_prompt_tokens,
    ):  # fmt: skip
        yield SimRequestSpec(*row)


def trace_request_rows(
    records: Iterable[TraceRow],
    *,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
    num_home_sites: int = 1,
    max_prompt_tokens: int | None = None,
) -> Iterator[SpecRow]:
    """``trace_requests`` over ``TraceRow``s (``mooncake.trace_rows``), as ``SpecRow``s."""
    if not rate_scale > 0:
        raise ValueError(f"rate scale must be > 0, got {rate_scale}")
    for i, (_, arrival_s, n, num_out, hashes) in enumerate(records):
        t = arrival_s / rate_scale
        if duration_s is not None and t >= duration_s:
            return
        if max_prompt_tokens is not None and n > max_prompt_tokens:
            keep = len(hashes) * max_prompt_tokens // n  # whole blocks still inside the cut
            n, hashes = max_prompt_tokens, hashes[:keep]
        yield (i, t, n, num_out, hashes, i % num_home_sites)
