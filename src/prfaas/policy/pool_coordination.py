"""Tenants' thresholds coordinate through the pool's feedback (issue 21, item 5).

Each tenant picks its offload threshold ``t`` (offload when the uncached length is over ``t``) to
balance three loads, from its own recent lengths and arrival rate:

- its local prefill: ``rate * E[T_local(l); l <= t] / N_local``;
- its part of the pool: ``rate * E[T_pool(l); l > t] / (N_pool * s)``, where ``s`` is the share
  the pool says this tenant can attain now (``PoolFeedback.attainable_share``: the weighted
  water-fill of the others' recent demand) - not the whole pool;
- the egress it can use: ``rate * E[S_kv(l); l > t] / min(link, s * egress)`` (its own link is its
  own; of the pool's egress it gets ``s``).

``t`` minimises the largest of the three (ties: the larger ``t``, leaving the pool to others),
each with the work already waiting drained over ``drain_horizon_s``: the local queue's
(``local_backlog_s / N_local``), the pool's expected queueing for this tenant and its own link's
unsent KV (both from the feedback), so a tenant whose pool queue or link backlog grows offloads
less and one whose local queue grows offloads more.
*Uncoordinated* (today's tuners) is the same search with ``s = 1`` and no pool feedback: every
tenant believes it owns the pool.

One rule, two drivers: the pool simulator's tenants (``sim/pool_tuning.py``) and a live tenant
gateway (``pool/tenant_tuner.py``) both build the search's inputs with ``tuner_inputs`` from what
the pool said (``PoolSaid.of`` its feedback, or ``NOTHING_SAID``), re-choose every
``TUNE_PERIOD_S`` once ``TUNE_MIN_SAMPLES`` lengths are in a window of ``TUNE_WINDOW_SIZE``, and
keep a request the router would offload local by ``keeps_local``. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prfaas.perf import CostModel

TUNE_PERIOD_S = 30.0
"""A tenant's tuner re-chooses ``t`` this often (modelled seconds); backlogs drain over it."""
TUNE_MIN_SAMPLES = 50
"""No re-choice until the tuner's window holds this many lengths."""
TUNE_WINDOW_SIZE = 2048
"""The tuner's window: the last this many uncached lengths (and their arrival times)."""


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """What the tenant's tuner knows of itself."""

    lengths: tuple[int, ...]
    """Recent uncached prompt lengths (tokens)."""
    rate_rps: float
    num_local_prefill: int
    link_bytes_per_s: float
    local_backlog_s: float = 0.0
    """Prefill work queued at the tenant's own prefill nodes (node-seconds)."""
    drain_horizon_s: float = 30.0
    """Backlogs count as load spread over this long (the tuner's period)."""


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """What the tenant knows of the pool: its group and the egress, and its share of them."""

    num_pool_nodes: int
    egress_bytes_per_s: float
    share: float
    """1.0 uncoordinated; the pool's attainable share coordinated."""
    expected_queueing_s: float = 0.0
    link_backlog_s: float = 0.0
    """The tenant's own link's unsent KV at the pool, in seconds of that link."""


@dataclass(frozen=True, slots=True)
class ThresholdChoice:
    threshold_tokens: int
    rho_local: float
    rho_pool: float
    rho_link: float
    effective_share: float


def choose_threshold(
    load: TenantLoad,
    pool: PoolCapacity,
    local_cost: CostModel,
    pool_cost: CostModel,
    kv_bytes: Callable[[int], int] | None = None,
) -> ThresholdChoice:
    """The coordination rule of the module docstring. ``kv_bytes``: ``S_kv`` in closed form
    (the simulator's ``KvBytes.total``); default ``pool_cost.kv_bytes``."""
    size = pool_cost.kv_bytes if kv_bytes is None else kv_bytes
    share = max(min(pool.share, 1.0), 1e-6)
    local_extra = load.local_backlog_s / max(load.num_local_prefill, 1e-9) / load.drain_horizon_s
    pool_extra = pool.expected_queueing_s / load.drain_horizon_s
    link_extra = pool.link_backlog_s / load.drain_horizon_s
    xs = sorted(load.lengths)
    n = len(xs)
    if n == 0 or load.rate_rps <= 0:
        return ThresholdChoice(0, 0.0, 0.0, 0.0, share)
    local_s = [local_cost.prefill_s(x) for x in xs]
    pool_s = [pool_cost.prefill_s(x) for x in xs]
    kv = [float(size(x)) for x in xs]
    per_req = load.rate_rps / n
    egress = min(load.link_bytes_per_s, share * pool.egress_bytes_per_s)
    pool_nodes = pool.num_pool_nodes * share
    remote_s, remote_b = sum(pool_s), sum(kv)
    local_acc = 0.0
    best: ThresholdChoice | None = None
    best_rho = float("inf")
    for k in range(n + 1):  # the first k (shortest) stay local
        if k > 0:
            local_acc += local_s[k - 1]
            remote_s -= pool_s[k - 1]
            remote_b -= kv[k - 1]
            if k < n and xs[k] == xs[k - 1]:
                continue  # a threshold cannot split equal lengths
        rho_l = per_req * local_acc / max(load.num_local_prefill, 1e-9) + local_extra
        rho_p = per_req * max(remote_s, 0.0) / pool_nodes + pool_extra
        rho_b = per_req * max(remote_b, 0.0) / egress + link_extra
        worst = max(rho_l, rho_p, rho_b)
        if worst <= best_rho * 1.01 or best is None:
            t = 0 if k == 0 else xs[k - 1]
            best_rho = min(best_rho, worst)
            best = ThresholdChoice(t, rho_l, rho_p, rho_b, share)
    assert best is not None
    return best


class _Feedback(Protocol):
    """What ``PoolSaid.of`` reads: ``policy.PoolFeedback`` (simulated) or the live
    ``pool.client.Feedback`` both have it."""

    @property
    def attainable_share(self) -> float: ...
    @property
    def expected_queueing_s(self) -> float: ...
    @property
    def link_backlog_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class PoolSaid:
    """What the pool's feedback tells a coordinated tenant's tuner."""

    share: float
    """The attainable share (1.0: as if the tenant owned the pool)."""
    expected_queueing_s: float = 0.0
    link_backlog_s: float = 0.0
    """Its own link's unsent KV at the pool, in seconds of that link."""

    @classmethod
    def of(cls, feedback: _Feedback) -> PoolSaid:
        return cls(feedback.attainable_share, feedback.expected_queueing_s, feedback.link_backlog_s)


NOTHING_SAID = PoolSaid(1.0)
"""An uncoordinated tenant's view: the whole pool, no queueing, no link backlog."""


def tuner_inputs(
    lengths: tuple[int, ...],
    rate_rps: float,
    *,
    num_local_prefill: int,
    link_bytes_per_s: float,
    local_backlog_s: float,
    num_pool_nodes: int,
    egress_bytes_per_s: float,
    said: PoolSaid,
    period_s: float = TUNE_PERIOD_S,
) -> tuple[TenantLoad, PoolCapacity]:
    """``choose_threshold``'s inputs, built alike by the simulator and a live tenant: backlogs
    drain over the tuner's ``period_s``; ``num_pool_nodes`` is the tenant's model's group."""
    load = TenantLoad(
        lengths,
        rate_rps,
        num_local_prefill,
        link_bytes_per_s,
        local_backlog_s=local_backlog_s,
        drain_horizon_s=period_s,
    )
    pool = PoolCapacity(
        num_pool_nodes, egress_bytes_per_s, said.share, said.expected_queueing_s,
        said.link_backlog_s,
    )  # fmt: skip
    return load, pool


def keeps_local(
    expected_queueing_s: float,
    ttft_target_s: float,
    local_backlog_s: float,
    num_local_prefill: int,
) -> bool:
    """A coordinated tenant's router gate: a request it would offload stays home when the pool's
    expected queueing for the tenant is over its TTFT target and the local queue
    (``local_backlog_s`` of prefill work over its prefill nodes) is shorter than that queueing."""
    if expected_queueing_s <= ttft_target_s:
        return False
    local_wait = local_backlog_s / max(num_local_prefill, 1)
    return local_wait < expected_queueing_s and num_local_prefill > 0
