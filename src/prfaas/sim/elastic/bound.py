"""``steady_state_bound``: for a rate over time, the pool nodes each interval needs at steady
state: the interval's offered uncached tokens per second over one node's prefill tokens per
second at a target utilisation, rounded up. A bound that ignores start-up (a node asked for
when the interval begins is not serving yet) and queueing across intervals; what a planner can
say before any simulation. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


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
