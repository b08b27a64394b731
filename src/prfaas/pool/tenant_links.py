"""A tenant's own link at the pool (``docs/pool.md``, the feedback's ``link``): the rate the
tenant told (``TenantLink``, with its receivers) and what the pool's nodes measured of it.

Each pool node process paces a tenant's KV on a route of its own (``tenant_route``: the group's
site to the tenant, ``"{group}->{tenant}"``, the name ``serve.node.pool_host.PoolNodeHost``
gives it)
and reports it in every heartbeat as a ``core.SenderLinkReport`` (modelled units: real bytes,
modelled seconds). ``LinkReading`` is what the placement driver tells the tenant of its link from
the latest reports of the live processes that have one for it (``combine``): usually one process
(a tenant's model is one group's), several when it submits to several groups. No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prfaas.core.ids import SiteId, link_id_for
from prfaas.core.link_report import SenderLinkReport


def tenant_route(group: str, tenant: str) -> str:
    """The route a group's node process sends ``tenant``'s KV on (its site is the group)."""
    return link_id_for(SiteId(group), SiteId(tenant))


@dataclass(frozen=True, slots=True)
class TenantLink:
    """A tenant's own link from the pool, as the tenant told it when it registered its receivers
    (its file's ``pool.link``): its constraint alone, paced per tenant at the pool's nodes."""

    gbps: float
    """Modelled Gbps (> 0)."""
    rtt_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (self.gbps > 0 and math.isfinite(self.gbps)):
            raise ValueError(f"link.gbps must be a finite number > 0, got {self.gbps}")
        if not (self.rtt_ms >= 0 and math.isfinite(self.rtt_ms)):
            raise ValueError(f"link.rtt_ms must be a finite number >= 0, got {self.rtt_ms}")

    @property
    def bytes_per_s(self) -> float:
        """The rate in modelled bytes per second (the admission's unit)."""
        return self.gbps * 1e9 / 8


def to_gbps(bytes_per_s: float) -> float:
    """Modelled bytes/s in Gbps (what the tenant told its link in)."""
    return bytes_per_s * 8 / 1e9


@dataclass(frozen=True, slots=True)
class LinkReading:
    """The pool's senders' reading of one tenant's link (modelled units)."""

    pace_bytes_per_s: float | None
    """The rate its KV is paced at (the tenant's told rate, each process under the pool's egress
    cap, which is not counted here); None: not paced per tenant (it told no rate, or tbf shapes
    the link)."""
    capacity_bytes_per_s: float
    """The best capacity estimate among the processes (each measures a lower bound of the one
    link: ``core.link_estimate``); the told rate until a busy span is measured; 0 with
    ``basis`` "": not estimated (no rate told)."""
    basis: str
    """"measured", "configured" or "" (not estimated)."""
    backlog_bytes: int
    """KV the senders accepted and the tenant's receivers have not acknowledged, summed."""
    rtt_s: float
    """The worst smoothed RTT (0: unknown)."""
    retransmit_rate: float
    num_senders: int
    """Node processes that report a route to this tenant."""

    def to_json(self) -> dict[str, Any]:
        pace = self.pace_bytes_per_s
        return {
            "pace_gbps": None if pace is None else to_gbps(pace),
            "capacity_gbps": to_gbps(self.capacity_bytes_per_s),
            "basis": self.basis,
            "backlog_bytes": self.backlog_bytes,
            "rtt_s": self.rtt_s,
            "retransmit_rate": self.retransmit_rate,
            "num_senders": self.num_senders,
        }


def combine(reports: Sequence[SenderLinkReport]) -> LinkReading | None:
    """One reading of a tenant's link from its routes' reports in several processes (None:
    none): the best estimate (the highest measured one, else the highest configured), the
    lowest pace, backlogs summed, the worst RTT and retransmit rate."""
    if not reports:
        return None
    estimated = [r for r in reports if r.basis]
    measured = [r for r in estimated if r.basis == "measured"]
    best = max(measured or estimated, key=lambda r: r.capacity_bytes_per_s, default=None)
    paces = [r.pace_bytes_per_s for r in reports if r.pace_bytes_per_s is not None]
    return LinkReading(
        pace_bytes_per_s=min(paces, default=None),
        capacity_bytes_per_s=0.0 if best is None else best.capacity_bytes_per_s,
        basis="" if best is None else best.basis,
        backlog_bytes=sum(r.backlog_bytes for r in reports),
        rtt_s=max(r.rtt_s for r in reports),
        retransmit_rate=max(r.retransmit_rate for r in reports),
        num_senders=len(reports),
    )


def link_json(told: TenantLink | None, reading: LinkReading | None) -> dict[str, Any]:
    """The feedback's (and the operator's) ``link``: what the tenant told (null: nothing) and
    the nodes' reading (null: no node has sent to it yet)."""
    return {
        "gbps": None if told is None else told.gbps,
        "rtt_ms": None if told is None else told.rtt_ms,
        "reading": None if reading is None else reading.to_json(),
    }
