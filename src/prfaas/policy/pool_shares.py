"""The pool's shapes and the weighted water-fill both the admission object and the tenants read.

A PrfaaS *pool* is shared by several tenants (PD clusters). ``PoolShape`` is what the pool offers
(node groups, one model each, and one total egress rate) and to whom (``TenantShare``: weight,
optional floor and caps). ``waterfill`` is the weighted max-min split of one resource among
tenants with demands: the rule behind the *attainable share* the pool feeds back to a tenant
(what it would get if it offered more, given what the others use now). Pure: no I/O, no clock;
imports nothing from ``prfaas.sim`` or ``prfaas.serve``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TenantShare:
    """One tenant's entitlement at the pool."""

    name: str
    weight: float = 1.0
    """Relative share of every shared resource while the tenant is backlogged (> 0)."""
    floor_nodes: tuple[tuple[str, int], ...] = ()
    """(group, nodes) held for this tenant: while it has work queued for the group and runs on
    fewer nodes than this, it is served first. Idle floor nodes serve others (work-conserving)."""
    max_queued_tokens: int | None = None
    """Cap on the uncached tokens this tenant may have queued (not started); above: refused."""
    max_rate_rps: float | None = None
    """Cap on accepted submits per second (a token bucket of depth max(1, rate)); above: refused."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("tenant name must not be empty")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"tenant {self.name}: weight must be > 0, got {self.weight}")
        for group, n in self.floor_nodes:
            if n < 0:
                raise ValueError(f"tenant {self.name}: floor.{group} must be >= 0, got {n}")
        if self.max_queued_tokens is not None and self.max_queued_tokens <= 0:
            raise ValueError(
                f"tenant {self.name}: max_queued_tokens must be > 0, got {self.max_queued_tokens}"
            )
        if self.max_rate_rps is not None and not self.max_rate_rps > 0:
            raise ValueError(
                f"tenant {self.name}: max_rate_rps must be > 0, got {self.max_rate_rps}"
            )

    def floor_for(self, group: str) -> int:
        return next((n for g, n in self.floor_nodes if g == group), 0)


@dataclass(frozen=True, slots=True)
class GroupShape:
    """A node group: ``num_nodes`` nodes serving one model."""

    name: str
    model: str
    num_nodes: int

    def __post_init__(self) -> None:
        if self.num_nodes <= 0:
            raise ValueError(f"group {self.name}: needs at least one node, got {self.num_nodes}")


@dataclass(frozen=True, slots=True)
class PoolShape:
    groups: tuple[GroupShape, ...]
    egress_bytes_per_s: float
    """The pool's total egress (every tenant's KV leaves through it), bytes/s."""
    tenants: tuple[TenantShare, ...]
    egress_window_s: float = 1.0
    """A prefill starts only while the pool's unsent KV is under this many seconds of egress (and
    the tenant's under this many seconds of its own link): egress is admitted like compute."""
    demand_horizon_s: float = 30.0
    """Time constant of the decayed demand each tenant's attainable share is computed from."""

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a pool needs at least one node group")
        if not self.tenants:
            raise ValueError("a pool needs at least one tenant")
        names = [t.name for t in self.tenants]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"tenants: duplicate name {dup[0]!r}")
        gnames = [g.name for g in self.groups]
        if len(set(gnames)) != len(gnames):
            raise ValueError(f"groups: duplicate group names in {gnames}")
        models = [g.model for g in self.groups]
        if len(set(models)) != len(models):
            raise ValueError(f"groups: one group per model, got models {models}")
        if not self.egress_bytes_per_s > 0:
            raise ValueError(f"egress must be > 0 bytes/s, got {self.egress_bytes_per_s}")
        for t in self.tenants:
            for g, _ in t.floor_nodes:
                if g not in gnames:
                    raise ValueError(f"tenant {t.name}: floor names unknown group {g!r}")

    def group_for_model(self, model: str) -> GroupShape | None:
        return next((g for g in self.groups if g.model == model), None)

    def group(self, name: str) -> GroupShape:
        return next(g for g in self.groups if g.name == name)

    @classmethod
    def one_tenant(
        cls, model: str, num_nodes: int, egress_bytes_per_s: float, tenant: str = "local"
    ) -> PoolShape:
        """Today's single-gateway deployment: its PrfaaS site is a pool with one tenant."""
        return cls(
            groups=(GroupShape(name="prfaas", model=model, num_nodes=num_nodes),),
            egress_bytes_per_s=egress_bytes_per_s,
            tenants=(TenantShare(name=tenant),),
        )


def waterfill(
    weights: Mapping[str, float], demands: Mapping[str, float], capacity: float = 1.0
) -> dict[str, float]:
    """Weighted max-min split of ``capacity``: no tenant gets more than its demand; the rest is
    split in proportion to weight among those still wanting more (``math.inf``: always wants)."""
    alloc = {name: 0.0 for name in weights}
    open_ = {name for name in weights if demands.get(name, 0.0) > 0}
    left = capacity
    while open_ and left > 1e-12:
        total_w = sum(weights[n] for n in open_)
        level = left / total_w  # capacity per unit of weight this round
        sated = {n for n in open_ if demands[n] - alloc[n] <= weights[n] * level}
        if not sated:
            for n in open_:
                alloc[n] += weights[n] * level
            break
        for n in sated:
            left -= demands[n] - alloc[n]
            alloc[n] = demands[n]
        open_ -= sated
    return alloc
