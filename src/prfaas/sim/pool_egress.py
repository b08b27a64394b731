"""The pool's egress as a fluid: KV flows from pool nodes to tenants' decode sites.

Each flow is one prefill's KV, streamed layer by layer: while its prefill runs it can go no faster
than it is produced (``kv_bytes / compute_s``); after, as fast as it is allowed. Allowed: each
tenant's flows together stay under the tenant's own link (its constraint, never shared), and the
tenants together under the pool's total egress, split by weighted max-min (``policy.waterfill``)
among tenants with something to send; a tenant's rate is split max-min among its flows. Rates
are recomputed at every change (a flow starts, a prefill ends, a flow ends). The admission
object reads the *backlog*: bytes produced and not yet sent. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prfaas.policy.pool_shares import waterfill


@dataclass(slots=True)
class EgressFlow:
    tenant: str
    key: object
    """The driver's handle (its request)."""
    kv_bytes: float
    start_s: float
    produced_by_s: float
    """When the prefill ends (the last layer exists)."""
    sent: float = 0.0
    rate: float = 0.0

    def cap(self, now: float) -> float:
        if now < self.produced_by_s:
            return self.kv_bytes / max(self.produced_by_s - self.start_s, 1e-12)
        return math.inf

    def produced(self, now: float) -> float:
        if now >= self.produced_by_s:
            return self.kv_bytes
        span = max(self.produced_by_s - self.start_s, 1e-12)
        return self.kv_bytes * max(0.0, now - self.start_s) / span


class PoolEgress:
    def __init__(
        self,
        egress_bytes_per_s: float,
        weights: dict[str, float],
        links: dict[str, float],
        window: tuple[float, float],
    ) -> None:
        self.egress_bytes_per_s = egress_bytes_per_s
        self.weights = weights
        self.links = links
        self.flows: list[EgressFlow] = []
        self.now = 0.0
        self._window = window
        self.sent_in_window: dict[str, float] = {t: 0.0 for t in weights}
        self.sent_total = 0.0
        self._by_tenant: dict[str, list[EgressFlow]] = {}
        """``flows`` by tenant, in order, as the last ``_rerate`` grouped them (every change of
        ``flows`` rerates)."""

    def advance(self, now: float) -> None:
        dt = now - self.now
        if dt > 0:
            lo, hi = self._window
            overlap = max(0.0, min(now, hi) - max(self.now, lo))
            for f in self.flows:
                moved = min(f.rate * dt, f.kv_bytes - f.sent)
                f.sent += moved
                self.sent_total += moved
                if overlap > 0 and f.rate > 0:
                    self.sent_in_window[f.tenant] += f.rate * overlap
        self.now = max(self.now, now)

    def add(self, flow: EgressFlow) -> None:
        self.flows.append(flow)
        self._rerate()

    def changed(self) -> None:
        """A prefill ended (caps changed): recompute the rates."""
        self._rerate()

    def take_finished(self) -> list[EgressFlow]:
        """Flows whose every byte is sent and whose prefill is done; removed."""
        eps = 1.0  # a byte: floating-point residue of rate * dt
        done = [f for f in self.flows if f.sent >= f.kv_bytes - eps and self.now >= f.produced_by_s]
        if done:
            self.flows = [f for f in self.flows if f not in done]
            self._rerate()
        return done

    def next_finish_s(self) -> float:
        t = math.inf
        for f in self.flows:
            if f.rate > 0 and self.now >= f.produced_by_s:
                t = min(t, self.now + max(0.0, f.kv_bytes - f.sent) / f.rate)
            elif self.now >= f.produced_by_s and f.sent >= f.kv_bytes - 1.0:
                t = min(t, self.now)
        return t

    def backlog(self) -> tuple[float, dict[str, float]]:
        per: dict[str, float] = {t: 0.0 for t in self.weights}
        for f in self.flows:
            per[f.tenant] += max(0.0, f.produced(self.now) - f.sent)
        return sum(per.values()), per

    def in_flight_bytes(self, tenant: str) -> float:
        """The KV of ``tenant``'s flows, each counted whole from its prefill's start until its
        last byte is sent: what the live front door says as the tenant's link backlog (its placed
        prefills' whole KV until their nodes' outcomes), and what a two-site link counts (a
        transfer whole from its first layer). A tenant's router reads it (``sim/pool_view.py``)."""
        return sum(f.kv_bytes for f in self._by_tenant.get(tenant, ()))

    def _rerate(self) -> None:
        now = self.now
        by_tenant: dict[str, list[EgressFlow]] = {}
        for f in self.flows:
            by_tenant.setdefault(f.tenant, []).append(f)
        self._by_tenant = by_tenant
        demands = {
            t: min(self.links[t], sum(f.cap(now) for f in fs)) for t, fs in by_tenant.items()
        }
        weights = {t: self.weights[t] for t in by_tenant}
        alloc = waterfill(weights, demands, self.egress_bytes_per_s)
        for t, fs in by_tenant.items():
            caps = {str(i): f.cap(now) for i, f in enumerate(fs)}
            split = waterfill({k: 1.0 for k in caps}, caps, alloc[t])
            for i, f in enumerate(fs):
                f.rate = split[str(i)]
