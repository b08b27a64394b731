"""``LinkPool``: one process's pooled outgoing KV links, the only place outside tests that connects
a ``Link``, builds link monitors or capacity estimators, or shares a pacer. ``serve.node.host.
WorkerHost`` (torch/timed nodes) and the vLLM connector's ``integrations.vllm.transfer_thread``
both send through one.

A pooled link is keyed by its ``Destination``: the receiver (host, port), the key it
authenticates with (a key id: today every process holds one, ``DEPLOYMENT_KEY``) and the route it
serves, the destination link the KV crosses (``None``: within the site). A receiver reached both
across sites and within its site gets two connections, paced and not: whether bytes are paced
follows from the route, never from whichever use came last.

Per destination link (``set_route``): one pacer every link of that route shares (the links to
several receivers cross one inter-site link, so they share its rate; created on first use), under
an optional process-wide egress cap (one more bucket every routed link shares:
``pacing.CappedPacer``); a ``LinkMonitor`` per link (RTT, retransmit rate); one capacity estimate
(``link_readings.SenderLinkEstimator``; a re-rated route is estimated afresh: a re-shaped link is
another link). ``run`` samples them on a timer; ``reports`` is one ``core.SenderLinkReport`` per
destination link.

Connects are bounded (``CONNECT_TIMEOUT_S`` per link, every connection of it authenticated), at
most one at a time per destination, shared by every caller waiting for it, with no lock across
destinations: a peer that does not answer delays only the sends aimed at it.

Units are the links' own: payload bytes and seconds of the running loop's clock (wall seconds);
callers convert for their reports. asyncio; no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from prfaas.core.ids import LinkId
from prfaas.core.link_estimate import CapacityBasis
from prfaas.core.link_report import SenderLinkReport
from prfaas.core.views import LinkState
from prfaas.transfer.config import DEFAULT_NUM_CONNECTIONS, TransferConfig
from prfaas.transfer.errors import ConnectError
from prfaas.transfer.link_readings import SenderEstimate, SenderLinkEstimator
from prfaas.transfer.monitor import LinkMonitor
from prfaas.transfer.pacing import CappedPacer, Pacer, TokenBucket, link_burst_bytes
from prfaas.transfer.sender import Link, pacer

log = logging.getLogger("prfaas.transfer")

DEPLOYMENT_KEY = "deployment"
"""The key id of the deployment's one key (``psk``), the only credential today."""
CONNECT_TIMEOUT_S = 5.0
"""Longest a KV link may take to connect and authenticate (every connection of it)."""
SAMPLE_INTERVAL_S = 0.25
"""The capacity estimators sample their links this often, on the pool's own timer: spans of at
least ``LINK_ESTIMATOR.min_interval_s`` (0.5 s) then end every 0.25 s, however often (or not)
anyone reads a report; sampled only at heartbeats a span would be a whole heartbeat and measure
only a transfer that kept the link busy for 90% of it."""
MONITOR_EVERY = 2
"""Monitors sample every second tick (0.5 s): over a shorter interval a retransmit rate rests on
too few segments (``transfer.monitor.MIN_RETRANSMIT_SEGMENTS``)."""


@dataclass(frozen=True, slots=True)
class Destination:
    """Where a pooled link goes and what it serves."""

    host: str
    port: int
    route: str | None
    """The destination link (``LinkId`` text, e.g. "pf->pd") the KV crosses; None: within the
    site (never paced, monitored or estimated)."""
    key_id: str = DEPLOYMENT_KEY


@dataclass(frozen=True, slots=True)
class KeyTLS:
    """TLS of the links one key authenticates, when it differs from the process's own (a pool
    node reaching each tenant's receivers under that tenant's CA)."""

    ca: str
    """PEM CA bundle the receivers' certificates chain to."""
    server_hostname: str


@dataclass(slots=True)
class _Route:
    """One destination link: its pace, shared pacer and capacity estimate."""

    name: str
    pace_bytes_per_s: float | None
    configured_bytes_per_s: float | None
    estimator: SenderLinkEstimator | None
    bucket: TokenBucket | None = None
    pacer: Pacer | None = None
    """What its links are paced with: the bucket, under the cap if there is one."""
    estimate: SenderEstimate | None = None
    monitors: dict[Destination, LinkMonitor] = field(default_factory=dict)


class LinkPool:
    """A process's outgoing KV links, pooled per ``Destination`` (loop thread only)."""

    def __init__(
        self,
        name: str,
        keys: Mapping[str, bytes],
        *,
        num_connections: int = DEFAULT_NUM_CONNECTIONS,
        egress_cap_bytes_per_s: float | None = None,
        client_ssl: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        connect_timeout_s: float | None = None,
        key_tls: Mapping[str, KeyTLS] | None = None,
    ) -> None:
        """``client_ssl``, ``server_hostname``: the TLS of every link (None: in the clear) but
        those whose key id is in ``key_tls``, which use that key's CA and name."""
        if egress_cap_bytes_per_s is not None and not egress_cap_bytes_per_s > 0:
            raise ValueError(f"egress_cap_bytes_per_s must be > 0, got {egress_cap_bytes_per_s}")
        self._name = name
        self._keys = dict(keys)
        self._num_connections = num_connections
        self._cap_rate = egress_cap_bytes_per_s
        self._cap: TokenBucket | None = None
        self._client_ssl = client_ssl
        self._server_hostname = server_hostname
        self._connect_timeout_s = connect_timeout_s
        self._routes: dict[str, _Route] = {}
        self._links: dict[Destination, Link] = {}
        self._key_tls = dict(key_tls or {})
        self._tls_contexts: dict[KeyTLS, ssl.SSLContext] = {}
        self._link_keys: dict[Destination, tuple[bytes, KeyTLS | None]] = {}
        """The key (and key TLS) each pooled link was made with (a reload closes those it
        changed)."""
        self._connecting: dict[Destination, asyncio.Task[Link]] = {}
        self._closed_acked_bytes = 0

    # -- destination links ---------------------------------------------------------------------
    def set_route(
        self, route: str, pace_bytes_per_s: float | None, configured_bytes_per_s: float | None
    ) -> None:
        """Pace destination link ``route`` at ``pace_bytes_per_s`` (None: unpaced) from the next
        chunk on, and estimate it afresh from ``configured_bytes_per_s`` (the rate the
        deployment names; None: not estimated). A re-shaped link is another link: what was
        measured of the old one would stand for the estimator's whole window."""
        estimator = None
        if configured_bytes_per_s is not None:
            estimator = SenderLinkEstimator(configured_bytes_per_s)
        r = self._routes.get(route)
        if r is None:
            self._routes[route] = _Route(route, pace_bytes_per_s, configured_bytes_per_s, estimator)
            return
        r.pace_bytes_per_s, r.configured_bytes_per_s = pace_bytes_per_s, configured_bytes_per_s
        r.estimator, r.estimate = estimator, None
        if pace_bytes_per_s is None:
            r.bucket = None
        elif r.bucket is not None:
            r.bucket.set_rate(
                pace_bytes_per_s, link_burst_bytes(pace_bytes_per_s),
                asyncio.get_running_loop().time(),
            )  # fmt: skip
        r.pacer = None  # made again (below, or at the next connect) around the bucket in force
        for dest, link in self._links.items():
            if dest.route == route:
                link.share_pacer(self._pacer_of(r))

    def _pacer_of(self, r: _Route) -> Pacer | None:
        """The route's shared pacer now (made on first use, in the loop)."""
        if r.pacer is not None:
            return r.pacer
        now = asyncio.get_running_loop().time()
        if r.pace_bytes_per_s is not None and r.bucket is None:
            r.bucket = pacer(r.pace_bytes_per_s, now)
        if self._cap_rate is not None:
            if self._cap is None:
                self._cap = pacer(self._cap_rate, now)
            r.pacer = CappedPacer(r.bucket, self._cap, now)
        else:
            r.pacer = r.bucket
        return r.pacer

    # -- the links -----------------------------------------------------------------------------
    async def link_to(self, dest: Destination) -> Link:
        """The pooled link to ``dest``, connecting it first if needed (at most one connect per
        destination at once; a waiter that is cancelled leaves the connect to the others)."""
        link = self._links.get(dest)
        if link is not None:
            return link
        pending = self._connecting.get(dest)
        if pending is None:
            pending = asyncio.create_task(self._connect(dest))
            self._connecting[dest] = pending
            pending.add_done_callback(functools.partial(self._connected, dest))
        return await asyncio.shield(pending)

    async def _connect(self, dest: Destination) -> Link:
        auth = self._auth_of(dest)
        if auth is None:
            raise ConnectError(f"no key with id {dest.key_id!r} for {dest.host}:{dest.port}")
        psk, key_tls = auth
        try:
            client_ssl, server_hostname = self._tls_of(key_tls)
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"key {dest.key_id!r}: CA {key_tls.ca if key_tls else ''!r} "
                               f"does not load: {exc}") from None  # fmt: skip
        route = None
        if dest.route is not None:
            route = self._routes.setdefault(dest.route, _Route(dest.route, None, None, None))
        config = TransferConfig(
            psk=psk,
            num_connections=self._num_connections,
            name=self._name,
            ssl_context=client_ssl,
            server_hostname=server_hostname,
        )
        timeout_s = self._connect_timeout_s
        if timeout_s is None:
            timeout_s = CONNECT_TIMEOUT_S  # read at call time (tests shorten it)
        try:
            async with asyncio.timeout(timeout_s):
                link = await Link.connect(dest.host, dest.port, config)
        except TimeoutError:
            raise ConnectError(
                f"cannot connect to {dest.host}:{dest.port}: no authenticated link within "
                f"{timeout_s:g} s"
            ) from None
        if self._auth_of(dest) != auth:  # a reload took the key away meanwhile
            with contextlib.suppress(Exception):
                await link.aclose()
            raise ConnectError(f"key {dest.key_id!r} was withdrawn while connecting")
        self._links[dest] = link
        self._link_keys[dest] = auth
        if route is not None:
            link.share_pacer(self._pacer_of(route))
            route.monitors[dest] = LinkMonitor(
                link, LinkId(f"{self._name}->{dest.host}:{dest.port}")
            )
        return link

    def _connected(self, dest: Destination, task: asyncio.Task[Link]) -> None:
        if self._connecting.get(dest) is task:
            del self._connecting[dest]
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Every sender waiting for this peer gets the error; say it once, with the peer: a
            # wrong key on either side shows up here.
            log.warning("KV link to %s:%d failed: %s", dest.host, dest.port, exc)

    async def drop(self, dest: Destination, link: Link | None = None) -> None:
        """Forget a link that failed (only if it is still ``link``, when given); the next send
        to ``dest`` reconnects."""
        current = self._links.get(dest)
        if current is None or (link is not None and current is not link):
            if link is not None:
                with contextlib.suppress(Exception):
                    await link.aclose()
            return
        del self._links[dest]
        self._link_keys.pop(dest, None)
        if dest.route is not None and (r := self._routes.get(dest.route)) is not None:
            r.monitors.pop(dest, None)
        self._closed_acked_bytes += current.counters().bytes_acked
        with contextlib.suppress(Exception):
            await current.aclose()

    async def set_keys(
        self, keys: Mapping[str, bytes], key_tls: Mapping[str, KeyTLS] | None = None
    ) -> int:
        """The keys (and per-key TLS) links may use from now on (a reload): each pooled link
        whose key id is gone, or names another key or TLS, is closed (a revoked tenant's links
        do not outlive its key; a send on one fails, and the next connect uses the new key).
        Returns how many were closed."""
        self._keys = dict(keys)
        self._key_tls = dict(key_tls or {})
        stale = [d for d in self._links if self._auth_of(d) != self._link_keys.get(d)]
        for dest in stale:
            await self.drop(dest)
        return len(stale)

    def _auth_of(self, dest: Destination) -> tuple[bytes, KeyTLS | None] | None:
        psk = self._keys.get(dest.key_id)
        return None if psk is None else (psk, self._key_tls.get(dest.key_id))

    def _tls_of(self, key_tls: KeyTLS | None) -> tuple[ssl.SSLContext | None, str | None]:
        if key_tls is None:
            return self._client_ssl, self._server_hostname
        ctx = self._tls_contexts.get(key_tls)
        if ctx is None:  # made once per CA and name: reading the bundle is not free
            ctx = self._tls_contexts[key_tls] = ssl.create_default_context(cafile=key_tls.ca)
        return ctx, key_tls.server_hostname

    def links(self, route: str | None) -> list[Link]:
        """The pooled links serving ``route`` now."""
        return [link for dest, link in self._links.items() if dest.route == route]

    def acked_bytes(self) -> int:
        """Bytes every link of this pool had acknowledged, dropped ones included."""
        live = sum(link.counters().bytes_acked for link in self._links.values())
        return self._closed_acked_bytes + live

    def backlog_bytes(self) -> int:
        """Bytes every link of this pool accepted and the receivers have not acknowledged."""
        return sum(link.counters().backlog_bytes for link in self._links.values())

    # -- what the reports read -----------------------------------------------------------------
    def sample(self, now_s: float, monitors: bool = True) -> None:
        """Feed every estimator its route's counters at ``now_s`` (loop seconds), and sample the
        monitors too when ``monitors``."""
        for r in self._routes.values():
            if r.estimator is not None:
                links = self.links(r.name)
                r.estimate = r.estimator.observe(now_s, links, r.pace_bytes_per_s)
            if monitors:
                for m in r.monitors.values():
                    m.sample(now_s)

    async def run(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        """Sample every ``interval_s`` (monitors every ``MONITOR_EVERY`` ticks), until
        cancelled."""
        loop = asyncio.get_running_loop()
        tick = 0
        while True:
            self.sample(loop.time(), monitors=tick % MONITOR_EVERY == 0)
            tick += 1
            await asyncio.sleep(interval_s)

    def report(self, route: str) -> SenderLinkReport | None:
        """Destination link ``route`` as the senders saw it at the last sample (None: unknown)."""
        r = self._routes.get(route)
        if r is None:
            return None
        states: list[LinkState] = [s for m in r.monitors.values() if (s := m.latest) is not None]
        backlog = sum(link.counters().backlog_bytes for link in self.links(route))
        capacity = 0.0
        basis: CapacityBasis | Literal[""] = ""
        if r.estimate is not None:
            capacity, basis = r.estimate.capacity_bytes_per_s, r.estimate.basis
        elif r.estimator is not None:  # not sampled since it was made
            capacity, basis = r.estimator.configured_bytes_per_s, "configured"
            if r.pace_bytes_per_s is not None:
                capacity = min(capacity, r.pace_bytes_per_s)
        return SenderLinkReport(
            link=route,
            configured_bytes_per_s=r.configured_bytes_per_s or 0.0,
            pace_bytes_per_s=r.pace_bytes_per_s,
            capacity_bytes_per_s=capacity,
            basis=basis,
            backlog_bytes=max(0, backlog),
            rtt_s=max((s.rtt_s for s in states), default=0.0),
            retransmit_rate=max((s.retransmit_rate for s in states), default=0.0),
        )

    def reports(self) -> tuple[SenderLinkReport, ...]:
        """One reading per destination link."""
        return tuple(rep for name in self._routes if (rep := self.report(name)) is not None)

    # -- life cycle ----------------------------------------------------------------------------
    async def stop_connects(self) -> None:
        """Cancel the connects under way and wait for them to unwind."""
        for connect in self._connecting.values():
            connect.cancel()
        for pending in list(self._connecting.values()):
            with contextlib.suppress(BaseException):
                await pending

    async def aclose(self) -> None:
        await self.stop_connects()
        links, self._links = list(self._links.values()), {}
        self._link_keys.clear()
        for r in self._routes.values():
            r.monitors.clear()
        for link in links:
            with contextlib.suppress(Exception):
                await link.aclose()
