"""``CrossSiteLinks``: the transfer thread's cross-site link bookkeeping, in the loop thread.

Owns what the vLLM Worker's ``TransferThread`` knows of the emulated inter-site link as a whole:
- the one pacer every cross-site link shares (created on first use at the pace; ``set_pace``
  re-rates it and re-estimates the link from the new rate);
- the capacity estimator (``transfer.link_readings.SenderLinkEstimator``, as WorkerHost's senders)
  and its own sampling timer (``sample``);
- the bytes cross-site sends handed to their links, and the link part of the agent's ``stats``.
Which links are cross-site is the transfer thread's to say (a callable it passes in): this module
holds no links, sessions or sockets. Imports neither torch nor vllm, nor ``transfer_thread``
(which imports it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from prfaas.integrations.vllm.settings import ConnectorSettings
from prfaas.integrations.vllm.trace import TRACE
from prfaas.transfer import Link
from prfaas.transfer.link_readings import SenderEstimate, SenderLinkEstimator
from prfaas.transfer.pacing import TokenBucket
from prfaas.transfer.sender import pacer

ESTIMATE_INTERVAL_S = 0.25
"""The capacity estimator samples the cross-site links this often, on its own timer: spans of at
least ``LINK_ESTIMATOR.min_interval_s`` (0.5 s) then end every 0.25 s, however often (or not) the
sidecar asks for ``stats``; sampled only at its polls (one a heartbeat, 0.5 s by default but a
deployment's choice) a span would be the whole heartbeat and measure only a transfer that kept
the link busy for 90% of it."""


class CrossSiteLinks:
    """The cross-site links' pacer, capacity estimate and counters (loop thread only)."""

    def __init__(
        self,
        settings: ConnectorSettings,
        links: Callable[[], list[Link]],
        clock: Callable[[], float],
    ) -> None:
        self._links = links  # the cross-site links now
        self._clock = clock  # the loop's clock
        # One pacer for every cross-site link (created on first use): the links to several
        # decode servers cross one emulated inter-site link, as WorkerHost's senders do.
        self._pace: float | None = settings.pace_bytes_per_s
        self._pacer: TokenBucket | None = None
        self._estimator: SenderLinkEstimator | None = None
        link_rate = settings.link_bytes_per_s
        if link_rate is not None:
            self._estimator = SenderLinkEstimator(link_rate)
        self._estimate: SenderEstimate | None = None
        self._cross_site_bytes = 0

    def pacer(self) -> TokenBucket | None:
        """The cross-site links' one pacer at the pace (None: unpaced)."""
        if self._pace is not None and self._pacer is None:
            self._pacer = pacer(self._pace, self._clock())
        return self._pacer

    def set_pace(self, gbps: float) -> dict[str, Any]:
        """Pace every cross-site link at ``gbps`` from the next chunk on (the agent's
        ``set_pace``), and estimate the link afresh from that rate: a re-shaped link is another
        link (what was measured of the old one would stand for the estimator's whole window)."""
        rate = gbps * 1e9 / 8
        self._pace = rate
        if self._pacer is not None:
            self._pacer.set_rate(rate, self._clock())
        for link in self._links():
            link.share_pacer(self.pacer())
        self._estimator = SenderLinkEstimator(rate)
        self._estimate = None
        TRACE("set_pace", gbps=gbps)
        return {"pace_gbps": gbps}

    def count_sent(self, num_bytes: int) -> None:
        """A cross-site send's link accepted ``num_bytes`` more."""
        self._cross_site_bytes += num_bytes

    async def sample(self) -> None:
        """Feed the capacity estimator the cross-site links' counters every
        ``ESTIMATE_INTERVAL_S`` (``transfer.link_readings``, as WorkerHost's senders); forever."""
        while True:
            if self._estimator is not None:
                now = self._clock()
                self._estimate = self._estimator.observe(now, self._links(), self._pace)
            await asyncio.sleep(ESTIMATE_INTERVAL_S)

    def stats(self, unsent_bytes: int) -> dict[str, Any]:
        """The cross-site link's figures: the pace, the capacity estimate of the cross-site links
        (``link_capacity_basis`` "" when the settings name no link rate: not estimated), the
        senders' unacknowledged bytes (``link_backlog_bytes``), the bytes they accepted so far,
        piece by piece (``cross_site_bytes``), and ``unsent_bytes``, what the open cross-site
        sends have not handed to them yet (``cross_site_unsent_bytes``, the transfer thread's
        count: a session counts whole from its opening, as WorkerHost's nodes count theirs)."""
        links = self._links()
        out: dict[str, Any] = {
            "pace_gbps": None if self._pace is None else self._pace * 8 / 1e9,
            "link_capacity_basis": "",
            "link_estimate_bytes_per_s": 0.0,
            "link_goodput_bytes_per_s": 0.0,
            "link_queue_bytes": 0,
            "link_backlog_bytes": sum(link.counters().backlog_bytes for link in links),
            "cross_site_bytes": self._cross_site_bytes,
            "cross_site_unsent_bytes": max(0, unsent_bytes),
        }
        est, estimator = self._estimate, self._estimator
        if est is not None:
            out.update(
                link_capacity_basis=est.basis,
                link_estimate_bytes_per_s=est.capacity_bytes_per_s,
                link_goodput_bytes_per_s=est.goodput_bytes_per_s,
                link_queue_bytes=est.queue_bytes,
            )
        elif estimator is not None:  # not sampled since it was made
            out.update(
                link_capacity_basis="configured",
                link_estimate_bytes_per_s=estimator.configured_bytes_per_s,
            )
        return out
