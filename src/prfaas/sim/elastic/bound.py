"""``steady_state_bound``: for a rate over time, the pool nodes each interval needs at steady
state: the interval's offered uncached tokens per second over one node's prefill tokens per
second at a target utilisation, rounded up. A bound that ignores start-up (a node asked for
when the interval begins is not serving yet) and queueing across intervals; what a planner can
say before any simulation. ``pool_bound`` is that bound for a workload's arrivals, as both
``prfaas sim`` (its elastic report) and ``prfaas plan`` (a file with ``autoscale:``) print it.
Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

BOUND_NOTE = "nodes per interval at steady state; a bound that ignores start-up"


def steady_state_bound(
    offered: Iterable[tuple[float, int]],
    interval_s: float,
    tokens_per_s_per_node: float,
    utilisation: float,
    duration_s: float,
) -> tuple[tuple[float, int], ...]:
    """(interval start s, nodes) for each interval of ``duration_s``; ``offered`` is (arrival s,
    uncached tokens) of what the pool is offered."""
    if not (interval_s > 0 and tokens_per_s_per_node > 0 and 0 < utilisation <= 1):
        raise ValueError("interval_s, tokens_per_s_per_node and utilisation must be > 0")
    num = max(1, math.ceil(duration_s / interval_s))
    tokens = [0] * num
    for at_s, n in offered:
        i = int(at_s // interval_s)
        if 0 <= i < num:
            tokens[i] += n
    per_node = tokens_per_s_per_node * utilisation * interval_s
    return tuple((i * interval_s, math.ceil(t / per_node - 1e-9)) for i, t in enumerate(tokens))


def pool_bound(
    arrivals: Iterable[tuple[float, int]],
    threshold_tokens: int,
    prefill_s: Callable[[int], float],
    interval_s: float,
    utilisation: float,
    duration_s: float,
) -> tuple[tuple[float, int], ...]:
    """``steady_state_bound`` of the prompts over ``threshold_tokens`` among ``arrivals`` (s,
    prompt tokens): what the pool is offered, each node's speed that of the mean offered prompt
    (``prefill_s(tokens)``: one pool node's seconds)."""
    offered = [(at_s, n) for at_s, n in arrivals if n > threshold_tokens]
    mean = sum(n for _, n in offered) // len(offered) if offered else threshold_tokens
    mean = max(1, mean)
    return steady_state_bound(offered, interval_s, mean / prefill_s(mean), utilisation, duration_s)
