"""``SenderLinkEstimator``: one process's cross-site sender ``Link``s turned into
``core.link_estimate.LinkReading``s and fed to one ``CapacityEstimator``; ``link_pool.LinkPool``
keeps one per destination link, for every sender of KV across sites (WorkerHost's torch/timed
nodes, the vLLM connector's transfer thread inside the vLLM Worker process).

Per link: bytes acknowledged are TCP's (``TCP_INFO`` bytes_acked, summed over the connections:
per segment, where the receiver's own ACK frames come per 4 MiB), the link's counters in memory;
the queue is what ``send`` accepted and no connection has written yet plus what the kernel holds
unsent (``notsent_bytes``). Aborted bytes are subtracted from the unwritten ones though some were
written: after an abort the queue reads low, never high, which can only make an interval look
idle. The link's own ``link_limited_s`` (its pacer in debt, a writer waiting for socket space)
says for how much of a span the link, not the producer or this process's share of the CPU, held
the KV back; only the kernel's unsent bytes count for the queue rule (``network_queue_bytes``):
they leave while this process waits for a core, the unwritten ones do not. A paced link's
bottleneck is its pacer: a kernel queue behind it means the receiving process fell behind (a busy
host), so for paced links only the pacer's time counts.

Units are the links' own: payload bytes and seconds of the loop clock the links run on (wall
seconds); the callers convert for their reports. Imports the asyncio sender only for its type;
no torch, so the vLLM venv imports it without prfaas's engine extra.
"""

from __future__ import annotations

import socket
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol

from prfaas.core.link_estimate import (
    CapacityBasis,
    CapacityEstimator,
    EstimatorConfig,
    LinkReading,
)
from prfaas.transfer.sender import LinkCounters
from prfaas.transfer.tcpinfo import read_tcp_info

LINK_ESTIMATOR = EstimatorConfig(
    window_s=3.0, busy_queue_bytes=64 << 10, min_interval_s=0.5, busy_fraction=0.9
)
"""Wall seconds and payload bytes. A span measures the link when the link held its sender back
(the pacer in debt or a writer waiting for socket space) for 90% of it, or, unpaced (under tbf the
queue sits in the kernel), when the kernel's unsent bytes at its start (at least 64 KiB: several
layer pieces, an emulated layer is ~10 KiB) held all the link then delivered. Rates are taken over
at least 0.5 s: over a shorter span a shaper's burst allowance (tbf: 64 KiB) or TCP's ramp after
idle reads as capacity."""


class SenderLink(Protocol):
    """What the readings need of a ``transfer.Link`` (tests pass their own)."""

    @property
    def peer_id(self) -> bytes: ...

    def counters(self) -> LinkCounters: ...

    def sockets(self) -> list[socket.socket]: ...


def link_reading(link: SenderLink, paced: bool) -> LinkReading:
    """One link's counters now (``paced``: its sends go through a pacer)."""
    c = link.counters()
    unwritten = max(0, c.bytes_queued - c.bytes_sent - c.bytes_dropped)
    infos = [i for i in (read_tcp_info(s) for s in link.sockets()) if i is not None]
    if infos:
        acked = sum(i.bytes_acked for i in infos)
        notsent = sum(i.notsent_bytes for i in infos)
        rtt = max(i.rtt_s for i in infos)
    else:  # in memory (tests), or no TCP_INFO: the link's own acknowledgements
        acked, notsent, rtt = c.bytes_acked, 0, 0.0
    return LinkReading(
        acked,
        unwritten + notsent,
        rtt,
        c.link_limited_s,
        network_queue_bytes=0 if paced else notsent,
    )


def link_readings(links: Iterable[SenderLink], paced: bool) -> dict[Hashable, LinkReading]:
    """Every link's reading, keyed by its random peer id: a replaced link (same peer, a new
    ``Link``) starts anew instead of reading as a counter that went backwards."""
    return {link.peer_id: link_reading(link, paced) for link in links}


@dataclass(frozen=True, slots=True)
class SenderEstimate:
    """The estimate after one observation, in the links' units (payload bytes, wall seconds)."""

    capacity_bytes_per_s: float
    """The estimate, never above the pacing rate in force (the KV cannot leave faster)."""
    basis: CapacityBasis
    goodput_bytes_per_s: float
    """Acknowledged bytes per second over the last span."""
    queue_bytes: int
    """Accepted by the senders and not sent yet (unwritten plus the kernel's unsent)."""
    backlog_bytes: int
    """Accepted by the senders and not acknowledged (the links' own counters), not given up."""


class SenderLinkEstimator:
    """The capacity of the one inter-site link a process's cross-site senders share, from their
    counters (``observe`` at every report or on a timer). A re-shaped link is another link:
    callers make a new estimator when they change the pacing rate (what was measured of the old
    one would stand for the whole window: a dip, or its end, would go unseen)."""

    def __init__(
        self, configured_bytes_per_s: float, config: EstimatorConfig = LINK_ESTIMATOR
    ) -> None:
        self._estimator = CapacityEstimator(configured_bytes_per_s, config)

    @property
    def configured_bytes_per_s(self) -> float:
        return self._estimator.configured_bytes_per_s

    def observe(
        self, now_s: float, links: Iterable[SenderLink], pace_bytes_per_s: float | None
    ) -> SenderEstimate:
        """Fold in the links' counters at ``now_s`` (loop seconds); ``pace_bytes_per_s`` is the
        pacing rate the links are held to now (None: unpaced, e.g. a tbf-shaped link)."""
        links = list(links)
        backlog = sum(link.counters().backlog_bytes for link in links)
        est = self._estimator.observe(now_s, link_readings(links, pace_bytes_per_s is not None))
        capacity = est.capacity_bytes_per_s
        if pace_bytes_per_s is not None:
            capacity = min(capacity, pace_bytes_per_s)
        return SenderEstimate(
            capacity, est.basis, est.goodput_bytes_per_s, est.queue_bytes, backlog
        )
