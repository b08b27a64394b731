"""``SenderLinkReport``: what a process's KV senders know of one destination link (an inter-site
link its cross-site KV crosses), the one typed reading a heartbeat carries per destination link.

``transfer.link_pool.LinkPool`` makes them (payload bytes, wall seconds); a worker process's host
converts them to modelled units (``scaled``) for its heartbeat; the vLLM connector's agent sends
them as JSON (``to_json``; the sidecar reads them back with ``from_json``); the gateway's registry
builds the link's ``LinkState`` from them. Pure: no I/O, stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prfaas.core.link_estimate import CapacityBasis


@dataclass(frozen=True, slots=True)
class SenderLinkReport:
    """One destination link as a process's senders see it (units: the producer's; ``scaled``
    converts)."""

    link: str
    """The destination link's id (``core.ids.link_id_for(src site, dst site)``, e.g. "pf->pd")."""
    configured_bytes_per_s: float
    """The link's rate the deployment names now (the file's, or what ``/link/rate`` set)."""
    pace_bytes_per_s: float | None
    """The rate its senders are paced at now; None: unpaced (e.g. tbf shapes the real link)."""
    capacity_bytes_per_s: float
    """The senders' capacity estimate (``core.link_estimate``), never above the pace; the
    configured rate until the first busy span (``basis`` "configured")."""
    basis: CapacityBasis | Literal[""]
    """"": not estimated (no rate known), then ``capacity_bytes_per_s`` means nothing."""
    backlog_bytes: int
    """Accepted by the senders and not yet acknowledged by the receivers, not given up."""
    rtt_s: float = 0.0
    """The worst smoothed RTT its connections saw over the last monitor interval (0: unknown)."""
    retransmit_rate: float = 0.0
    """The worst retransmit rate over the last monitor interval (0: unmeasured)."""

    def scaled(
        self, bytes_per_payload_byte: float, wall_s_per_modelled_s: float
    ) -> SenderLinkReport:
        """The same reading in modelled units: payload bytes x ``bytes_per_payload_byte``, wall
        seconds / ``wall_s_per_modelled_s`` (a rate: x both)."""
        rate = bytes_per_payload_byte * wall_s_per_modelled_s
        return dataclasses.replace(
            self,
            configured_bytes_per_s=self.configured_bytes_per_s * rate,
            pace_bytes_per_s=None
            if self.pace_bytes_per_s is None
            else self.pace_bytes_per_s * rate,
            capacity_bytes_per_s=self.capacity_bytes_per_s * rate,
            backlog_bytes=int(self.backlog_bytes * bytes_per_payload_byte),
            rtt_s=self.rtt_s / wall_s_per_modelled_s,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: object) -> SenderLinkReport:
        """Read one back; a ``ValueError`` names the bad field."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"link report must be an object, got {raw!r:.100}")
        names = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(raw) - names):
            raise ValueError(f"link report: unknown fields {unknown}")
        link = raw.get("link")
        if not isinstance(link, str) or not link:
            raise ValueError(f"link report: link must be a non-empty string, got {link!r}")
        basis = raw.get("basis")
        if basis not in ("", "configured", "measured"):
            raise ValueError(f"link report: basis {basis!r}")
        pace = raw.get("pace_bytes_per_s")
        return cls(
            link=link,
            configured_bytes_per_s=_number(raw, "configured_bytes_per_s"),
            pace_bytes_per_s=None if pace is None else _number(raw, "pace_bytes_per_s"),
            capacity_bytes_per_s=_number(raw, "capacity_bytes_per_s"),
            basis=basis,
            backlog_bytes=int(_number(raw, "backlog_bytes")),
            rtt_s=_number(raw, "rtt_s", 0.0),
            retransmit_rate=_number(raw, "retransmit_rate", 0.0),
        )


def _number(raw: Mapping[str, Any], key: str, default: float | None = None) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"link report: {key} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"link report: {key} must be >= 0, got {value!r}")
    return float(value)
