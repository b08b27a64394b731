"""``SenderLinks``: a worker process's KV sender links (``serve.node.host.WorkerHost`` owns one).

The links are pooled per (peer host, port, cross-site), opened per peer, at most one connect per
peer at a time, each bounded by ``CONNECT_TIMEOUT_S``: a peer that does not answer delays only
the prefills aimed at it. The cross-site ones share one pacer (``transfer.pacing.TokenBucket``,
created on first use): the links to several decode nodes cross one emulated inter-site link, so
they share its rate. Each cross-site link has a ``LinkMonitor`` (RTT, retransmit rate), and all
of them feed one capacity estimate (``transfer.link_readings.SenderLinkEstimator``).

Units are the links' own (payload bytes, wall seconds); the host converts for its reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl

from prfaas.core import LinkId, LinkState
from prfaas.transfer import ConnectError, LinkMonitor, TransferConfig
from prfaas.transfer import Link as TransferLink
from prfaas.transfer.link_readings import SenderEstimate, SenderLinkEstimator
from prfaas.transfer.pacing import TokenBucket
from prfaas.transfer.sender import pacer

log = logging.getLogger("prfaas.node")

CONNECT_TIMEOUT_S = 5.0
"""Longest a KV link may take to connect and authenticate (every connection of it)."""

_Key = tuple[str, int, bool]


class SenderLinks:
    def __init__(
        self,
        name: str,
        site: str,
        psk: bytes,
        pace_bytes_per_s: float | None,
        configured_bytes_per_s: float,
        client_ssl: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self._name = name
        self._site = site
        self._psk = psk
        self._client_ssl = client_ssl
        self._server_hostname = server_hostname
        self._pace = pace_bytes_per_s
        self._estimator = SenderLinkEstimator(configured_bytes_per_s)
        self._links: dict[_Key, TransferLink] = {}
        self._pacer: TokenBucket | None = None
        self._monitors: dict[_Key, LinkMonitor] = {}
        # One connect per peer at a time, shared by every prefill waiting for that peer; no lock
        # across peers (a connect to a dead peer must not stall the others).
        self._connecting: dict[_Key, asyncio.Task[TransferLink]] = {}

    # -- the links ---------------------------------------------------------------------------
    async def link_to(self, host: str, port: int, cross_site: bool) -> TransferLink:
        """The pooled link to a peer's receiver, connecting it first if needed (at most one
        connect per peer at once; a waiter that is cancelled leaves the connect to the others)."""
        key = (host, port, cross_site)
        link = self._links.get(key)
        if link is not None:
            return link
        pending = self._connecting.get(key)
        if pending is None:
            pending = asyncio.create_task(self._connect(key))
            self._connecting[key] = pending
            pending.add_done_callback(functools.partial(self._connected, key))
        return await asyncio.shield(pending)

    async def _connect(self, key: _Key) -> TransferLink:
        host, port, cross_site = key
        config = TransferConfig(
            psk=self._psk,
            rate_limit_bytes_per_s=self._pace if cross_site else None,
            timeout_s=30.0,
            name=self._name,
            ssl_context=self._client_ssl,
            server_hostname=self._server_hostname,
        )
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                link = await TransferLink.connect(host, port, config)
        except TimeoutError:
            raise ConnectError(
                f"cannot connect to {host}:{port}: no authenticated link within "
                f"{CONNECT_TIMEOUT_S:g} s"
            ) from None
        self._links[key] = link
        if cross_site:
            link.share_pacer(self._shared_pacer())
            self._monitors[key] = LinkMonitor(link, LinkId(f"{self._site}->{host}:{port}"))
        return link

    def _connected(self, key: _Key, task: asyncio.Task[TransferLink]) -> None:
        if self._connecting.get(key) is task:
            del self._connecting[key]
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Every prefill waiting for this peer gets the error (it falls back to local
            # prefill); say it once, with the peer: a wrong key on either side shows up here.
            log.warning("KV link to %s:%d failed: %s", key[0], key[1], exc)

    async def drop(self, host: str, port: int, cross_site: bool) -> None:
        """Forget a link that failed; the next prefill to that peer reconnects."""
        link = self._links.pop((host, port, cross_site), None)
        self._monitors.pop((host, port, cross_site), None)
        if link is not None:
            with contextlib.suppress(Exception):
                await link.aclose()

    # -- pacing ------------------------------------------------------------------------------
    def set_pace(self, pace_bytes_per_s: float | None, configured_bytes_per_s: float) -> None:
        """Pace every cross-site link at ``pace_bytes_per_s`` from now on (None: unpaced) and
        estimate the link afresh: a re-shaped link is another link (what was measured of the
        old one would stand for the estimator's whole window: a dip, or its end, went unseen)."""
        self._pace = pace_bytes_per_s
        self._estimator = SenderLinkEstimator(configured_bytes_per_s)
        if pace_bytes_per_s is None:
            self._pacer = None
        elif self._pacer is not None:
            self._pacer.set_rate(pace_bytes_per_s, asyncio.get_running_loop().time())
        for (_host, _port, cross_site), link in self._links.items():
            if cross_site:
                link.share_pacer(self._shared_pacer())

    def _shared_pacer(self) -> TokenBucket | None:
        """The cross-site links' one pacer at the pace (None: unpaced, netns)."""
        if self._pace is not None and self._pacer is None:
            self._pacer = pacer(self._pace, asyncio.get_running_loop().time())
        return self._pacer

    # -- what the reports read ---------------------------------------------------------------
    def estimate(self, now_s: float) -> SenderEstimate:
        """Feed the capacity estimator the cross-site links' counters now."""
        links = [link for key in self._monitors if (link := self._links.get(key)) is not None]
        return self._estimator.observe(now_s, links, self._pace)

    def monitor_states(self, now_s: float) -> list[LinkState]:
        """What each cross-site link's monitor saw since its last sample (TCP_INFO)."""
        return [s for m in self._monitors.values() if (s := m.sample(now_s)) is not None]

    # -- life cycle --------------------------------------------------------------------------
    async def stop_connects(self) -> None:
        """Cancel the connects under way and wait for them to unwind."""
        for connect in self._connecting.values():
            connect.cancel()
        for pending in list(self._connecting.values()):
            with contextlib.suppress(BaseException):
                await pending

    async def aclose(self) -> None:
        for link in self._links.values():
            with contextlib.suppress(Exception):
                await link.aclose()
