"""``LinkMonitor``: a link's health as ``prfaas.core.LinkState`` snapshots for the routing policy.

Each ``sample(now_s)`` reads the sender's own counters (bytes acknowledged by the receiver, backlog)
and ``TCP_INFO`` of every connection, and differentiates them against the previous sample.
``link_state`` (pure) does the arithmetic and applies ``prfaas.core.CongestionRule`` (the one rule
the simulator and the gateway apply too) to all it measures: utilisation (goodput / capacity),
drain (backlog / capacity), retransmit rate and queueing (srtt above min_rtt).

``capacity_bytes_per_s`` is the configured share of the link if given, else the pacing rate, else
the highest goodput seen so far (a lower bound that makes ``utilisation`` 1.0 when saturated).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from prfaas.core import CongestionRule, LinkId, LinkState
from prfaas.transfer.sender import Link
from prfaas.transfer.tcpinfo import read_tcp_info

__all__ = ["CongestionRule", "LinkMonitor", "LinkSample", "link_state"]


MIN_RETRANSMIT_SEGMENTS = 256
"""Fewest segments sent in an interval for its retransmit rate to count: at the rule's 2% a
smaller sample rests on fewer than 5 retransmissions (an emulated link's payload, 1/byte_divisor
of the modelled KV, sends ~100 loopback segments per heartbeat, where a receiver starved of CPU
for an instant costs one or two: read as 4-9% "loss", it congested an idle 100 Gbps link)."""


@dataclass(frozen=True, slots=True)
class LinkSample:
    """Cumulative counters of a link at one instant."""

    at_s: float
    bytes_acked: int
    backlog_bytes: int
    total_retrans: int
    segs_out: int
    rtt_s: float
    """Mean smoothed RTT over the connections (0 if unknown)."""
    min_rtt_s: float


def link_state(
    link_id: LinkId,
    capacity_bytes_per_s: float,
    prev: LinkSample,
    cur: LinkSample,
    rule: CongestionRule,
) -> LinkState:
    """The snapshot for the interval ``prev -> cur``. Pure."""
    dt = max(cur.at_s - prev.at_s, 1e-9)
    goodput = max(0, cur.bytes_acked - prev.bytes_acked) / dt
    segs = max(0, cur.segs_out - prev.segs_out)
    retrans = max(0, cur.total_retrans - prev.total_retrans)
    # Over a handful of segments one retransmission reads as several percent: below
    # MIN_RETRANSMIT_SEGMENTS the rate is not measured (0, as the rule takes an unmeasured one).
    retransmit_rate = retrans / segs if segs >= MIN_RETRANSMIT_SEGMENTS else 0.0
    queueing = max(0.0, cur.rtt_s - cur.min_rtt_s) if cur.rtt_s else 0.0
    drain = cur.backlog_bytes / capacity_bytes_per_s if capacity_bytes_per_s > 0 else 0.0
    utilisation = goodput / capacity_bytes_per_s if capacity_bytes_per_s > 0 else 0.0
    return LinkState(
        link_id=link_id,
        capacity_bytes_per_s=capacity_bytes_per_s,
        utilisation=utilisation,
        goodput_bytes_per_s=goodput,
        backlog_bytes=cur.backlog_bytes,
        rtt_s=cur.rtt_s,
        retransmit_rate=retransmit_rate,
        congested=rule.congested(utilisation, drain, retransmit_rate, queueing, cur.min_rtt_s),
        sampled_at_s=cur.at_s,
    )


class LinkMonitor:
    def __init__(
        self,
        link: Link,
        link_id: LinkId,
        capacity_bytes_per_s: float | None = None,
        rule: CongestionRule | None = None,
    ) -> None:
        self.link = link
        self.link_id = link_id
        self.rule = rule or CongestionRule()
        self._capacity = capacity_bytes_per_s
        self._peak_goodput = 0.0
        self._prev: LinkSample | None = None
        self.latest: LinkState | None = None

    def _read(self, now_s: float) -> LinkSample:
        counters = self.link.counters()
        infos = [i for i in (read_tcp_info(s) for s in self.link.sockets()) if i is not None]
        rtts = [i.rtt_s for i in infos if i.rtt_s > 0]
        min_rtts = [i.min_rtt_s for i in infos if i.min_rtt_s > 0]
        return LinkSample(
            at_s=now_s,
            bytes_acked=counters.bytes_acked,
            backlog_bytes=counters.backlog_bytes,
            total_retrans=sum(i.total_retrans for i in infos),
            segs_out=sum(i.segs_out for i in infos),
            rtt_s=sum(rtts) / len(rtts) if rtts else 0.0,
            min_rtt_s=min(min_rtts) if min_rtts else 0.0,
        )

    def capacity_bytes_per_s(self) -> float:
        if self._capacity is not None:
            return self._capacity
        rate = self.link.rate_bytes_per_s
        return rate if rate is not None else self._peak_goodput

    def sample(self, now_s: float) -> LinkState | None:
        """A new snapshot (None on the first call, which only sets the baseline)."""
        cur = self._read(now_s)
        prev, self._prev = self._prev, cur
        if prev is None:
            return None
        dt = max(cur.at_s - prev.at_s, 1e-9)
        self._peak_goodput = max(self._peak_goodput, (cur.bytes_acked - prev.bytes_acked) / dt)
        self.latest = link_state(self.link_id, self.capacity_bytes_per_s(), prev, cur, self.rule)
        return self.latest

    async def run(self, publish: Callable[[LinkState], None], interval_s: float = 0.5) -> None:
        """Sample every ``interval_s`` and publish each snapshot, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            state = self.sample(loop.time())
            if state is not None:
                publish(state)
            await asyncio.sleep(interval_s)
