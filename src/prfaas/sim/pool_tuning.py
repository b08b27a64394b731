"""The pool simulator's tenant tuners: the first threshold before anything was observed, and each
re-search (``policy.choose_threshold`` over what the tenant knows and the pool feeds back). Pure.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from prfaas.policy.pool_coordination import PoolSaid, choose_threshold, tuner_inputs
from prfaas.sim.pool_scenario import PoolSimScenario, PoolSimTenant

SAMPLE = 512
"""Lengths the first threshold is chosen from."""


def first_sample(spec: PoolSimTenant, sc: PoolSimScenario) -> tuple[tuple[int, ...], float, float]:
    """(lengths, rate, share) the tuner starts from: its trace's first requests or draws from its
    length distribution; a coordinated tenant's share is its weight's part until the pool has
    said more, an uncoordinated one believes it has the whole pool."""
    if spec.trace is not None:  # the trace's first requests, as its tuner would see them
        lengths = tuple(n for _, n in spec.trace[:SAMPLE])
        span = spec.trace[min(SAMPLE - 1, len(spec.trace) - 1)][0] - spec.trace[0][0]
        rate = (min(SAMPLE, len(spec.trace)) - 1) / span if span > 0 else 1.0
    else:
        rng = random.Random(spec.seed + 7919)
        lengths = tuple(spec.lengths.draw(rng) for _ in range(SAMPLE))
        rate = spec.arrival.rate_rps
    weights = {t.name: t.weight for t in sc.shape.tenants}
    share = weights[spec.name] / sum(weights.values()) if spec.tuner == "coordinated" else 1.0
    return lengths, rate, share


def tenant_threshold(
    spec: PoolSimTenant,
    sc: PoolSimScenario,
    kv_bytes: Callable[[int], int],
    lengths: tuple[int, ...],
    rate: float,
    said: PoolSaid,
    local_backlog_s: float,
) -> int:
    """``said``: the pool's feedback (``PoolSaid.of``), or ``NOTHING_SAID`` for a tenant that
    does not read it. The inputs are ``tuner_inputs``'s, as a live tenant builds them."""
    group = sc.group_for(spec.model)
    load, pool = tuner_inputs(
        lengths,
        rate,
        num_local_prefill=spec.num_local_prefill,
        link_bytes_per_s=spec.link_bytes_per_s,
        local_backlog_s=local_backlog_s,
        num_pool_nodes=group.num_nodes,
        egress_bytes_per_s=sc.shape.egress_bytes_per_s,
        said=said,
        period_s=sc.tune_interval_s,
    )
    return choose_threshold(load, pool, spec.local_cost, group.cost, kv_bytes).threshold_tokens
