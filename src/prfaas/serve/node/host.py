"""``WorkerHost``: one worker process's nodes, its transfer receiver and sender links, and its
control-plane client (registration, heartbeats to the gateway's control listener, signed with the
deployment's key: the loop is ``control_plane``'s, shared with the vLLM host; what a heartbeat
carries and how its answer is applied are this host's). One site per process.

The receiver (one port per process) hands each incoming session to the node that expects its
request; the sender links are a ``transfer.link_pool.LinkPool`` (pooled per destination, key and
route, one bounded connect per destination at a time), the cross-site ones paced at the
inter-site link's emulated rate (an R Gbps link is paced at R / byte_divisor / time_scale for the
timed engine, at R for real engines: the site's own engine decides; one pacer for all of them:
they cross one link).

A PrfaaS pool's node is a ``serve.node.pool_host.PoolNodeHost``, this host with the pool's parts:
per-tenant routes paced under the pool's egress cap, per-tenant prefix namespaces, and the
heartbeat that says them. What it changes is named by the hooks here (``egress_cap_bytes_per_s``,
``paces_site_link``, ``route_of``, ``_in_namespace``, the heartbeat's ``_namespace_reports``,
``_refuse_link_rate``); a deployment's node runs them as written here.

The inter-site link's capacity is measured, not taken from the deployment file: the pool samples
the cross-site links' counters on its own timer (``transfer.link_readings``, shared with the vLLM
connector) into one ``core.link_estimate.CapacityEstimator``, and every heartbeat carries the
pool's ``core.SenderLinkReport`` per destination link, converted to modelled units like every
other report field.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from prfaas.config import DeploymentConfig
from prfaas.core import NodeRole, SiteId
from prfaas.core.fingerprint import first_difference
from prfaas.core.ids import link_id_for
from prfaas.core.link_report import SenderLinkReport
from prfaas.engine.api import Engine
from prfaas.engine.fingerprint import engine_fingerprint
from prfaas.perf import CostModel
from prfaas.pool_file import resolve_key
from prfaas.serve.auth import SignedAuth
from prfaas.serve.control_tls import control_tls, tls_contexts
from prfaas.serve.keyring import ring_of_psks
from prfaas.serve.node.control_plane import (
    MAX_PROCESS_NAME_BYTES as MAX_PROCESS_NAME_BYTES,
)
from prfaas.serve.node.control_plane import (
    BackgroundTasks,
    registration,
    run_control_plane,
    site_of_nodes,
)
from prfaas.serve.node.control_plane import default_process_name as default_process_name
from prfaas.serve.node.engines import build_engine, prefix_store_bytes
from prfaas.serve.node.hosting import LinkRateRefused
from prfaas.serve.node.messages import (
    MAX_LINK_REPORTS,
    Heartbeat,
    NodeReport,
    PrefillCommand,
    PrefillOutcome,
    PrefixAckMsg,
    PrefixNamespaceMsg,
    PrefixPullCommand,
    PrefixPushCommand,
    PrefixReportMsg,
    Registration,
)
from prfaas.serve.node.notice import NoticeDesk
from prfaas.serve.node.prefix_move import PendingMoves, is_move, new_move_id
from prfaas.serve.node.prefix_store import PrefixStore
from prfaas.serve.node.worker import Node
from prfaas.transfer import (
    InboundSession,
    Manifest,
    Receiver,
    Refused,
    SessionAborted,
    TransferConfig,
    TransferError,
)
from prfaas.transfer import Link as TransferLink
from prfaas.transfer.link_pool import Destination, KeyTLS, LinkPool

log = logging.getLogger("prfaas.node")
DEPLOYMENT_KEY_ID = "deployment"
"""The key id of the deployment's ``psk`` (the one credential a worker process holds today)."""


class WorkerHost:
    paces_site_link = True
    """Whether the site's one inter-site link is paced (a pool node's is not: each tenant's
    route is)."""

    def __init__(
        self,
        deployment: DeploymentConfig,
        node_names: Sequence[str],
        control_url: str,
        host: str = "127.0.0.1",
        process_name: str = "",
        link_keys: Mapping[str, bytes] | None = None,
        link_tls: Mapping[str, KeyTLS] | None = None,
    ) -> None:
        """``link_keys``: more keys (id -> key) its KV links may authenticate with, named by a
        ``PrefillCommand.key_id`` (a PrfaaS pool's node holds every tenant's key); ``link_tls``:
        the TLS of the links under some of them (each tenant's receivers, under its CA)."""
        self.site = site_of_nodes(deployment, node_names, "worker process")
        self.deployment = deployment
        self.host = host
        self.control_url = control_url.rstrip("/")
        self.process_name = process_name or default_process_name(node_names)
        eng = deployment.engine_for(self.site.name)  # the site's own settings, if any
        capacity = prefix_store_bytes(eng, self.site.hardware)
        self.prefix_store = store = PrefixStore(
            capacity, eng.block_tokens, eng.checkpoint_every_blocks
        )
        self.moves = PendingMoves(store)
        self.nodes: dict[str, Node] = {}
        for name in node_names:
            cfg = deployment.node(name)
            engine = build_engine(eng, self.site.hardware, deployment.simulation)
            self.nodes[name] = Node(
                name,
                self.site.name,
                NodeRole(cfg.role),
                engine,
                self.prefix_store,
                fixed_role=self.site.kind == "prfaas",
            )
        self._psk = deployment.psk.encode()
        self.auth = SignedAuth(ring_of_psks(deployment.psk, deployment.accept_psks))
        """Signs this process's calls: to the gateway's control listener and to other workers."""
        self._server_ssl, self._client_ssl = _ssl_contexts(deployment)
        # One rate per inter-site link, both directions (PD -> PrfaaS carries prefix moves).
        home = deployment.home_site.name
        link = next(
            (
                lk
                for lk in deployment.links
                if self.site.name in (lk.src, lk.dst) and home in (lk.src, lk.dst)
            ),
            None,
        )
        self.link_gbps: float | None = link.gbps if link is not None else None
        self.route: str | None = None
        """The destination link this process's cross-site KV crosses (its ``LinkId``)."""
        if link is not None:
            other = link.dst if link.src == self.site.name else link.src
            self.route = link_id_for(SiteId(self.site.name), SiteId(other))
        tls = deployment.tls
        self.links = LinkPool(
            self.process_name,
            {**(link_keys or {}), DEPLOYMENT_KEY_ID: self._psk},
            egress_cap_bytes_per_s=self.egress_cap_bytes_per_s(),
            client_ssl=self._client_ssl,
            server_hostname=tls.server_hostname if tls is not None else None,
            key_tls=link_tls,
        )
        if self.route is not None and self.paces_site_link:
            self.links.set_route(
                self.route, self.link_rate_bytes_per_s(), self._configured_wall_rate()
            )
        self._cost: tuple[CostModel | None] | None = None
        """The site's cost model, once looked up (None inside: a real engine on a preset)."""
        self.notice = NoticeDesk(self._prefill_estimate_s)
        """A spot notice's bookkeeping (``serve/node/notice.py``): told of every prefill."""
        self.fingerprint = engine_fingerprint(eng.model, eng.block_tokens, eng.kind, eng.model_path)
        """This site's model (``core.fingerprint``): stated on every KV manifest its nodes send,
        and what an incoming manifest's fingerprint must match (a pool tenant's decode node
        refuses KV from a pool group of other weights, naming the field)."""
        for node in self.nodes.values():
            node.notice = self.notice
            node.fingerprint = self.fingerprint
        self.receiver: Receiver | None = None
        self.transfer_port = 0
        self.pool_receiver: Receiver | None = None
        """A PrfaaS pool's tenant: the receiver of KV from the pool (its decode nodes only)."""
        self.pool_transfer_port = 0
        self.http_port = 0
        self._tasks = BackgroundTasks()

    # -- transfer --------------------------------------------------------------------------------
    def _allocate(self, manifest: Manifest) -> Sequence[object]:
        # Before anything is allocated: KV of another model must never reach a cache. Only the
        # fields both sides state are compared (the vLLM connector's sender states none; an
        # emulated site no folder's): this guards against a misconfigured peer, which holds the
        # link's key; the engine then checks the layout itself (``engine.manifest_check``).
        stated = dict(manifest.fingerprint)
        diff = first_difference({k: v for k, v in self.fingerprint if k in stated}, stated)
        if diff is not None:
            name, sent, own = diff
            raise Refused(
                f"{manifest.request_id}: model fingerprint.{name} {sent!r} differs from "
                f"{self.process_name}'s {own!r}"
            )
        if is_move(manifest.request_id):
            buffers = self.moves.allocate(manifest)
            if buffers is None:
                raise Refused(f"{self.process_name} expects no prefix {manifest.request_id}")
            return buffers
        for node in self.nodes.values():
            if node.expects(manifest.request_id):
                return node.allocate(manifest)
        raise Refused(f"no node of {self.process_name} expects {manifest.request_id}")

    async def _consume_sessions(self, receiver: Receiver) -> None:
        async for session in receiver:
            self.spawn(self._complete(session))

    async def _complete(self, session: InboundSession) -> None:
        rid = session.manifest.request_id
        if is_move(rid):
            try:
                self.moves.delivered(await session.complete(timeout_s=30.0))
            except SessionAborted as exc:
                self.moves.failed(rid, exc)
            return
        node = next((n for n in self.nodes.values() if n.expects(rid)), None)
        try:
            delivery = await session.complete(timeout_s=self.deployment.gateway.request_timeout_s)
        except SessionAborted as exc:
            if node is not None:
                node.on_transfer_failed(rid, exc)
            return
        if node is not None:
            node.on_delivered(rid, delivery.first_token)

    def _prefill_estimate_s(self, num_tokens: int, kv_bytes: int) -> float:
        """Wall seconds of one prefill here and its KV stream, before any was measured: the
        site's cost model (scaled to wall time) or the paced stream, whichever is longer (the KV
        streams layer by layer while the next layer computes)."""
        from prfaas.scenarios import site_cost_model

        if self._cost is None:
            self._cost = (site_cost_model(self.deployment, self.site),)
        (cost,) = self._cost
        eng = self.deployment.engine_for(self.site.name)
        compute_s = 0.0 if cost is None else cost.prefill_s(num_tokens, 0)
        rate = self.link_rate_bytes_per_s()
        stream_s = kv_bytes / rate if rate else 0.0
        return max(compute_s * eng.wall_s_per_modelled_s, stream_s)

    def link_rate_bytes_per_s(self) -> float | None:
        """Wall-clock pacing rate of this site's KV sender: the modelled link scaled down (none
        when the deployment runs in network namespaces: tbf shapes the real link then)."""
        if self.link_gbps is None or self.deployment.netns:
            return None
        # The same conversion as the estimator's: a real engine (torch) sends real bytes in
        # real time, so its link is paced at the file's rate; scaling it by byte_divisor too
        # paced a torch deployment's 10 Gbps link at 10 Mbit/s (found by the fidelity bench).
        return self._configured_wall_rate()

    def _wall_scale(self) -> float:
        """Modelled bytes per second for one wall-clock payload byte per second (the registry's
        conversion: payload x byte_divisor, wall seconds / time_scale)."""
        eng = self.deployment.engine_for(self.site.name)  # the site's own engine converts
        return eng.real_bytes_per_payload_byte * eng.wall_s_per_modelled_s

    def _configured_wall_rate(self) -> float:
        """The deployment file's link rate in wall payload bytes/s (0: no inter-site link)."""
        return 0.0 if self.link_gbps is None else self._wall_rate(self.link_gbps)

    def _wall_rate(self, gbps: float) -> float:
        """``gbps`` (modelled) in wall payload bytes/s, converted by the site's own engine."""
        return gbps * 1e9 / 8 / self._wall_scale()

    def egress_cap_bytes_per_s(self) -> float | None:
        """The process-wide cap over every sender link, wall payload bytes/s (None: none; a
        pool node's is the pool's egress). Called by ``__init__`` to build the link pool."""
        return None

    def _refuse_link_rate(self) -> None:
        """Raise ``LinkRateRefused`` when ``/link/rate`` cannot shape this process's link: with
        ``netns: true`` tbf shapes it there, nothing here paces it (this used to change only the
        rate the reports and the estimator claimed)."""
        if self.deployment.netns:
            raise LinkRateRefused(
                f"site {self.site.name}: with netns: true tbf shapes the link and the senders "
                "do not pace it; change the shaper (tc) instead"
            )

    async def set_link_gbps(self, gbps: float) -> None:
        """Shape the inter-site link (modelled Gbps): paces every cross-site sender from now on
        (unless ``_refuse_link_rate`` refuses)."""
        self._refuse_link_rate()
        self.link_gbps = gbps
        # The estimate starts afresh (LinkPool.set_route): a re-shaped link is another link.
        if self.route is not None:
            self.links.set_route(
                self.route, self.link_rate_bytes_per_s(), self._configured_wall_rate()
            )

    def handshake_failures(self) -> int:
        """KV handshakes this process's receiver refused since it started (wrong key, bad or
        oversized HELLO, handshake timeout): the receiver logs each with the peer."""
        return 0 if self.receiver is None else self.receiver.num_handshake_failures

    def reports(self) -> list[NodeReport]:
        update = {"handshake_failures": self.handshake_failures()}
        return [n.report().model_copy(update=update) for n in self.nodes.values()]

    def link_reports(self) -> list[SenderLinkReport]:
        """The pool's reading of each destination link (its last sample: RTT, retransmit rate,
        capacity estimate, backlog), in modelled units. The gateway applies the congestion rule
        (``core.CongestionRule``) to the rate; the monitor's queueing term is left out there:
        it reads wall-clock RTT, which a busy emulation host inflates without any network
        cause."""
        eng = self.deployment.engine_for(self.site.name)
        return [
            r.scaled(eng.real_bytes_per_payload_byte, eng.wall_s_per_modelled_s)
            for r in self.links.reports()
        ]

    def _destination(
        self, host: str, port: int, cross_site: bool, key_id: str, route: str | None = None
    ) -> Destination:
        """``route``: the destination link the KV crosses when it is not the site's one link (a
        pool tenant's, ``route_of``; cross-site only)."""
        if not cross_site:
            route = None
        elif route is None:
            route = self.route
            if route is None:  # no link in the file: a separate, unpaced connection
                route = f"{self.site.name}->?"
        return Destination(host, port, route, key_id or DEPLOYMENT_KEY_ID)

    async def link_to(
        self, host: str, port: int, cross_site: bool, key_id: str = "", route: str | None = None
    ) -> TransferLink:
        """The pooled link to a peer's receiver (``LinkPool.link_to``)."""
        return await self.links.link_to(self._destination(host, port, cross_site, key_id, route))

    async def set_link_keys(
        self, link_keys: Mapping[str, bytes], link_tls: Mapping[str, KeyTLS] | None = None
    ) -> int:
        """Replace ``__init__``'s ``link_keys`` and ``link_tls`` (a pool node's reload of its
        tenants' keys): links under a key now gone or changed are closed; returns how many."""
        return await self.links.set_keys({**link_keys, DEPLOYMENT_KEY_ID: self._psk}, link_tls)

    async def drop_link(
        self, host: str, port: int, cross_site: bool, key_id: str = "", route: str | None = None
    ) -> None:
        """Forget a link that failed; the next prefill to that peer reconnects."""
        await self.links.drop(self._destination(host, port, cross_site, key_id, route))

    def route_of(self, cmd: PrefillCommand) -> str | None:
        """The route ``cmd``'s KV takes when it is not the site's one link (a pool node: its
        tenant's own); None: the site's one link, or within the site."""
        return None

    def _in_namespace(self, cmd: PrefillCommand) -> tuple[PrefillCommand, str]:
        """``cmd`` as its prefix is looked up and stored, and the store's namespace for it: a
        deployment's as it came, in the one namespace (a pool node: its tenant's)."""
        return cmd, ""

    async def prefill(
        self, name: str, cmd: PrefillCommand, on_computed: Callable[[], None] | None = None
    ) -> PrefillOutcome:
        """Node ``name`` prefills ``cmd`` into a session on the pooled link to the decode node's
        receiver (connected first if needed; a link that failed to connect is dropped);
        ``on_computed``: as ``Node.prefill``'s."""
        cmd, namespace = self._in_namespace(cmd)
        route = self.route_of(cmd)
        dest = (cmd.decode_host, cmd.decode_transfer_port, cmd.cross_site, cmd.key_id, route)
        try:
            link = await self.link_to(*dest)
        except (TransferError, OSError) as exc:
            return PrefillOutcome(request_id=cmd.request_id, ok=False, error=f"connect: {exc}")
        outcome = await self.nodes[name].prefill(cmd, link, namespace, on_computed)
        if not outcome.ok and "Connect" in outcome.error:
            await self.drop_link(*dest)
        return outcome

    # -- prefix moves -----------------------------------------------------------------------------
    def _any_engine(self) -> Engine:
        return next(iter(self.nodes.values())).engine

    async def pull_prefix(self, cmd: PrefixPullCommand, client: httpx.AsyncClient) -> int:
        """Fetch a prefix from another site into this process's store; returns its tokens."""
        move_id = new_move_id(self.process_name)
        layout = self._any_engine().layout(cmd.num_tokens, 0)
        arrived = self.moves.expect(move_id, cmd.block_hashes, layout)
        push = PrefixPushCommand(
            move_id=move_id,
            block_hashes=cmd.block_hashes,
            num_tokens=cmd.num_tokens,
            dst_host=self.host,
            dst_transfer_port=self.transfer_port,
            cross_site=cmd.cross_site,
        )
        try:
            async with asyncio.timeout(cmd.timeout_s):
                r = await client.post(
                    f"{cmd.src_url}/prefix/push", json=push.model_dump(), auth=self.auth
                )
                if r.status_code != 200:
                    raise RuntimeError(f"source refused the move: {r.status_code} {r.text}")
                return await arrived
        finally:
            self.moves.forget(move_id)

    async def push_prefix(self, cmd: PrefixPushCommand) -> int:
        """Send a stored prefix to another process (the source side of a move)."""
        num_tokens = cmd.num_tokens
        prefix = self.prefix_store.lookup(cmd.block_hashes, num_tokens + 1, num_tokens)
        if prefix is None or prefix.num_tokens != num_tokens:
            raise LookupError(f"no stored prefix of {num_tokens} tokens here")
        layout = self._any_engine().layout(num_tokens, 0)
        link = await self.link_to(cmd.dst_host, cmd.dst_transfer_port, cmd.cross_site)
        manifest = Manifest.from_layout(cmd.move_id, layout, self.fingerprint)
        async with link.session(manifest) as session:
            for layer in prefix.layers:
                for offset, view in layer.pieces():
                    await session.send(layer.position, offset, view)
            await session.finish()
        return num_tokens

    # -- life cycle ------------------------------------------------------------------------------
    async def start(self, http_port: int) -> None:
        self.http_port = http_port
        # Every site receives: KV (decode nodes) and prefix moves (any site).
        config = TransferConfig(psk=self._psk, name=self.process_name, ssl_context=self._server_ssl)
        self.receiver = Receiver(config, self._allocate)
        await self.receiver.__aenter__()
        wanted = max((self.deployment.node(n).transfer_port for n in self.nodes), default=0)
        _, self.transfer_port = await self.receiver.listen(self.host, wanted)
        self.spawn(self._consume_sessions(self.receiver))
        pool = self.deployment.pool
        if pool is not None and any(n.role is NodeRole.DECODE for n in self.nodes.values()):
            # A tenant of a PrfaaS pool: the pool's nodes send KV under the tenant's pool key,
            # never the deployment's psk, so they get a receiver of their own (docs/pool.md).
            key = resolve_key(pool.key, Path.cwd(), "pool.key")
            pool_config = TransferConfig(
                psk=key, name=f"{self.process_name}-pool", ssl_context=self._server_ssl
            )
            self.pool_receiver = Receiver(pool_config, self._allocate)
            await self.pool_receiver.__aenter__()
            wanted = max(self.deployment.node(n).pool_transfer_port for n in self.nodes)
            _, self.pool_transfer_port = await self.pool_receiver.listen(self.host, wanted)
            self.spawn(self._consume_sessions(self.pool_receiver))
        self.spawn(self.links.run())
        for node in self.nodes.values():
            self.spawn(node.decode_loop())
        self.spawn(self._control_plane())

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro)

    async def stop(self) -> None:
        self._tasks.cancel()
        await self.links.stop_connects()
        await self._tasks.join()
        await self.links.aclose()
        for receiver in (self.receiver, self.pool_receiver):
            if receiver is not None:
                with contextlib.suppress(Exception):
                    await receiver.aclose()
        for node in self.nodes.values():  # joins each engine's thread; pending work fails
            with contextlib.suppress(Exception):
                await asyncio.to_thread(node.close)

    def health_details(self) -> dict[str, object]:
        return {}

    def registration(self) -> Registration:
        reg = registration(
            self.process_name,
            self.nodes.values(),
            self.host,
            self.http_port,
            self.transfer_port,
        )
        if self.pool_transfer_port:
            reg.nodes = [
                ep.model_copy(update={"pool_transfer_port": self.pool_transfer_port})
                if ep.role == "decode"
                else ep
                for ep in reg.nodes
            ]
        return reg

    def heartbeat(self) -> Heartbeat:
        """Every node's load report, each destination link's reading and the prefix store's next
        unacknowledged changes (a pool node: what its store holds per tenant namespace instead)."""
        return Heartbeat(
            process=self.process_name,
            reports=self.reports(),
            # A pool node with more tenant routes than a heartbeat carries reports the first.
            links=self.link_reports()[:MAX_LINK_REPORTS],
            prefix=self._prefix_report(),
            namespaces=self._namespace_reports()[:MAX_LINK_REPORTS],
        )

    def _prefix_report(self) -> PrefixReportMsg | None:
        """The store's changes not yet acknowledged (the gateway mirrors them; a pool node's
        front door too, to place prefills where their prefixes are)."""
        return PrefixReportMsg.of(self.prefix_store.report())

    def _namespace_reports(self) -> list[PrefixNamespaceMsg]:
        """The store per namespace (a pool node's; none here: the journal says it)."""
        return []

    def _on_heartbeat_answer(self, r: httpx.Response) -> None:
        """The gateway's acknowledgement of our prefix report (what it applied; a snapshot if it
        saw a gap). An answer without one changes nothing: the changes are sent again."""
        try:
            body = r.json()
            ack = body.get("prefix") if isinstance(body, dict) else None
            if ack is not None:
                self.prefix_store.acknowledge(PrefixAckMsg.model_validate(ack).to_ack())
        except ValueError as exc:  # not JSON, or not an acknowledgement
            log.debug("heartbeat answer without a usable prefix acknowledgement: %s", exc)

    async def _control_plane(self) -> None:
        """Register, then heartbeat (``control_plane.run_control_plane``); every registration
        starts the gateway's mirror of our prefix store afresh (a snapshot)."""
        await run_control_plane(
            self.control_url,
            self.auth,
            self.deployment.heartbeat_interval_s,
            log,
            self.registration,
            self.heartbeat,
            on_registered=self.prefix_store.snapshot,
            on_heartbeat_answer=self._on_heartbeat_answer,
            tls=control_tls(self.deployment),
        )


def _ssl_contexts(d: DeploymentConfig) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """(receiver context, sender context) from the deployment's TLS files, or none."""
    return (None, None) if d.tls is None else tls_contexts(d.tls)
