"""``VllmHost``: a vLLM site's node process (the sidecar), the counterpart of
``serve.node.host.WorkerHost``. It starts and supervises one vLLM server for all of its nodes
(``server.VllmServer``), registers the nodes with the gateway at once (with the fault "vLLM
server starting" until the server's ``/health`` answers: the gateway keeps them out of rotation
meanwhile), heartbeats their reports (vLLM's ``/metrics`` and the connector agent's stats), and
stops the server when the process stops.

It has no KV receiver or sender of its own: the registered transfer port is the one the
connector's receiver binds inside the vLLM Worker process. What the server's prefix cache holds
comes from its KV cache events (``kv_events.KvEventSubscriber``, one store per process as a
worker process's ``PrefixStore``): the heartbeats carry it to the gateway's mirror, and a decode
node's "ready" says how much of a prompt its server holds. Prefix moves between sites are not
offered (vLLM keeps its prefix cache to itself): a pull answers that it failed, a push that the
prefix is not here, and the gateway computes the prefix instead. Must not import vllm.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from prfaas.config import DeploymentConfig, SiteConfig
from prfaas.core import NodeRole, SiteId
from prfaas.core.ids import link_id_for
from prfaas.core.link_report import SenderLinkReport
from prfaas.integrations.vllm.settings import ConnectorSettings
from prfaas.serve.auth import SignedAuth
from prfaas.serve.control_tls import control_tls
from prfaas.serve.keyring import ring_of_psks
from prfaas.serve.node.control_plane import (
    BackgroundTasks,
    default_process_name,
    registration,
    run_control_plane,
    site_of_nodes,
)
from prfaas.serve.node.hosting import LinkRateRefused, LinkRateUnavailable
from prfaas.serve.node.messages import (
    Heartbeat,
    NodeReport,
    PrefillCommand,
    PrefillOutcome,
    PrefixAckMsg,
    PrefixPullCommand,
    PrefixPushCommand,
    PrefixReportMsg,
    Registration,
)
from prfaas.serve.vllm.agent import AgentClient, AgentError, AgentStats
from prfaas.serve.vllm.kv_events import KvEventSubscriber
from prfaas.serve.vllm.metrics import (
    VllmLoad,
    kv_bytes_per_token,
    kv_capacity_bytes,
    vllm_load,
)
from prfaas.serve.vllm.node import VllmEndpoint, VllmNode
from prfaas.serve.vllm.server import (
    PRIVATE_FOLDER_PREFIX,
    KvEventsEndpoints,
    ServerSpec,
    VllmServer,
    is_cpu_build,
    owner_tag,
    server_spec,
)

log = logging.getLogger("prfaas.vllm")
NUM_CONNECTIONS = 4


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The server's figures at the last poll."""

    load: VllmLoad = field(default_factory=VllmLoad)
    stats: AgentStats = field(default_factory=AgentStats)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class VllmHost:
    def __init__(
        self,
        deployment: DeploymentConfig,
        node_names: Sequence[str],
        control_url: str,
        host: str = "127.0.0.1",
        process_name: str = "",
    ) -> None:
        self._site = site_of_nodes(deployment, node_names, "node process")
        self._deployment = deployment
        self.engine = deployment.engine_for(self._site.name)
        if self.engine.kind != "vllm":
            raise ValueError(f"site {self._site.name} does not run vLLM")
        self.host = host
        self._control_url = control_url.rstrip("/")
        self._process_name = process_name or default_process_name(node_names)
        self._auth = SignedAuth(ring_of_psks(deployment.psk, deployment.accept_psks))
        link = deployment.link_to_home(self._site.name)
        self._link_gbps: float | None = None if link is None else link.gbps
        """The site's link rate: the file's, then what ``/link/rate`` set."""
        self._route = str(link_id_for(SiteId(self._site.name), SiteId(deployment.home_site.name)))
        """The destination link the connector's cross-site sends cross (its reading's name)."""
        # vLLM's KV is real-sized (the gateway counts it so): the link's own rate, not scaled.
        # None with netns: tbf shapes the real link. The agent's set_pace changes it.
        self._pace_gbps: float | None = None
        if link is not None and not deployment.netns:
            self._pace_gbps = link.gbps
        self._egress_base = 0
        """Cross-site bytes of the server's earlier lives (its counters restart with it)."""
        self._pace_changes = 0
        self._pacing = False
        """A ``/link/rate`` is being applied (the poll leaves the pace alone meanwhile)."""
        self.http_port = 0
        self.transfer_port = 0
        # Uncapped, as the gateway's node client: a decode stream waits for its KV while other
        # calls (prefills, metrics) need connections; the gateway's admission bounds them.
        self._client = httpx.AsyncClient(
            trust_env=False, timeout=30.0, limits=httpx.Limits(max_connections=None)
        )
        self._agent_dir: Path | None = None
        self.agent = AgentClient("")
        """Its socket's path is known once the process starts (a private temporary folder)."""
        self.server: VllmServer | None = None
        self._endpoint = VllmEndpoint("", self.engine.model, self._client, self._fault)
        self.kv_events: KvEventSubscriber | None = None
        """The server's KV cache events as prefix entries (None: prefix caching off)."""
        self._endpoint.cached_tokens = self._cached_tokens
        self._nodes: dict[str, VllmNode] = {}
        for name in node_names:
            self._nodes[name] = VllmNode(
                name,
                self._site.name,
                NodeRole(deployment.node(name).role),
                self._endpoint,
                self.agent,
                shares_server=self._nodes.__contains__,
                spawn=self.spawn,
                transfer_timeout_s=deployment.gateway.request_timeout_s,
                fixed_role=self._site.kind == "prfaas",
            )
        self._bytes_per_token = _bytes_per_token(self.engine.model_path, self.engine.dtype)
        self._snapshot = _Snapshot()
        self._tasks = BackgroundTasks()

    # -- what the node app reads -----------------------------------------------------------------
    @property
    def deployment(self) -> DeploymentConfig:
        return self._deployment

    @property
    def site(self) -> SiteConfig:
        return self._site

    @property
    def process_name(self) -> str:
        return self._process_name

    @property
    def control_url(self) -> str:
        return self._control_url

    @property
    def auth(self) -> SignedAuth:
        return self._auth

    @property
    def nodes(self) -> dict[str, VllmNode]:
        return self._nodes

    @property
    def link_gbps(self) -> float | None:
        return self._link_gbps

    async def set_link_gbps(self, gbps: float) -> None:
        """Re-pace the server's cross-site sends (the connector's one pacer, through the agent's
        ``set_pace``; its capacity estimate starts afresh). Refused with ``netns: true`` (tbf
        shapes the link, nothing here paces it) and while the server cannot be asked."""
        if self._deployment.netns:
            raise LinkRateRefused(
                f"site {self._site.name}: with netns: true tbf shapes the link and the connector "
                "does not pace it; change the shaper (tc) instead"
            )
        server = self.server
        if server is None or not server.ready.is_set():
            why = self._fault() or "not ready"
            raise LinkRateUnavailable(f"site {self._site.name}: the vLLM server is down: {why}")
        before, self._pace_gbps = self._pace_gbps, gbps
        self._pace_changes += 1
        self._pacing = True
        try:
            await self.agent.set_pace(gbps)
        except AgentError as exc:
            self._pace_gbps = before
            raise LinkRateUnavailable(
                f"site {self._site.name}: the vLLM server's connector did not take the pace: {exc}"
            ) from None
        finally:
            self._pacing = False
        self._link_gbps = gbps

    def _fault(self) -> str:
        return "vLLM server starting" if self.server is None else self.server.fault

    async def prefill(
        self, name: str, cmd: PrefillCommand, on_computed: Callable[[], None] | None = None
    ) -> PrefillOutcome:
        # vLLM's server computes and sends inside itself: it is not told apart from the
        # verification here, so ``on_computed`` is never called (the outcome frees the node).
        return await self._nodes[name].prefill(cmd)

    async def pull_prefix(self, cmd: PrefixPullCommand, client: httpx.AsyncClient) -> int:
        raise RuntimeError("vLLM nodes keep their prefix cache inside vLLM: no prefix moves")

    async def push_prefix(self, cmd: PrefixPushCommand) -> int:
        raise LookupError("vLLM nodes keep their prefix cache inside vLLM: no prefix moves")

    def health_details(self) -> dict[str, object]:
        s = self.server
        return {
            "vllm": {
                "state": "starting" if s is None else s.state.value,
                "pid": None if s is None else s.pid,
                "starts": 0 if s is None else s.num_starts,
                "fault": self._fault(),
                "prefix_report": None if self.kv_events is None else self.kv_events.details(),
            }
        }

    def _cached_tokens(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> int:
        """The prefix of a prompt the server's cache holds, per its KV cache events."""
        if self.kv_events is None:
            return 0
        return self.kv_events.translator.cached_tokens(block_hashes, num_prompt_tokens)

    # -- reports ---------------------------------------------------------------------------------
    def reports(self) -> list[NodeReport]:
        fault = self._fault()
        load, stats = self._snapshot.load, self._snapshot.stats
        capacity = kv_capacity_bytes(
            load, self._bytes_per_token, self.engine.vllm.kv_cache_space_gib
        )
        out = []
        prefill_nodes = [n for n in self._nodes.values() if n.role is NodeRole.PREFILL]
        for node in self._nodes.values():
            # One server for all nodes: each reports its load. Its cross-site bytes and what
            # its open sends have not handed over are the server's, so only one prefill node
            # carries them (the gateway sums a site's).
            carries = bool(prefill_nodes) and node is prefill_nodes[0]
            out.append(
                NodeReport(
                    node=node.name,
                    site=node.site,
                    role=node.role.value,
                    queue_depth=load.num_waiting,
                    queued_tokens=node.queued_tokens,
                    batch_size=load.num_running,
                    kv_used_bytes=int(load.kv_cache_usage * capacity),
                    kv_capacity_bytes=capacity,
                    draining=node.draining,
                    egress_bytes=self._egress_base + stats.cross_site_bytes if carries else 0,
                    egress_backlog_bytes=stats.cross_site_unsent_bytes if carries else 0,
                    fault=fault,
                    handshake_failures=stats.handshake_failures,
                    prefilled_tokens=node.meter.prefilled_tokens,
                    prefill_busy_s=node.meter.busy_s(time.monotonic()),
                    # The server's steps, each running its decode batch (a restart counts anew).
                    decode_steps=load.num_steps if node.role is NodeRole.DECODE else 0,
                )
            )
        return out

    def link_reports(self) -> list[SenderLinkReport]:
        """The connector's reading of each destination link (``transfer.link_pool``, as
        WorkerHost's), converted by the site's engine: none for vLLM (real bytes, real seconds:
        ``EngineConfig.real_bytes_per_payload_byte`` and ``wall_s_per_modelled_s`` are 1)."""
        eng = self.engine
        return [
            r.scaled(eng.real_bytes_per_payload_byte, eng.wall_s_per_modelled_s)
            for r in self._snapshot.stats.links
        ]

    async def _poll(self) -> None:
        """Refresh the server's figures once per heartbeat (while it serves)."""
        interval = self._deployment.heartbeat_interval_s
        while True:
            server = self.server
            if server is not None and server.ready.is_set():
                load, stats = self._snapshot.load, self._snapshot.stats
                try:
                    r = await self._client.get(f"{server.spec.base_url}/metrics", timeout=2.0)
                    if r.status_code == 200:
                        load = vllm_load(r.text)
                except httpx.HTTPError as exc:
                    log.debug("vLLM /metrics: %s", exc)
                try:
                    stats = await self._agent_stats()
                except AgentError as exc:
                    log.debug("agent stats: %s", exc)
                self._snapshot = _Snapshot(load, stats)
            else:
                self._snapshot = _Snapshot(stats=self._snapshot.stats)
            await asyncio.sleep(interval)

    async def _agent_stats(self) -> AgentStats:
        """The agent's stats; a restarted server's counters start again from zero (its earlier
        cross-site bytes are kept here: the gateway reads them as cumulative) and its pace from
        the file's (what ``/link/rate`` set is applied again)."""
        changes = self._pace_changes
        stats = await self.agent.stats()
        last = self._snapshot.stats
        if stats.cross_site_bytes < last.cross_site_bytes:
            self._egress_base += last.cross_site_bytes
        want = self._pace_gbps
        settled = not self._pacing and changes == self._pace_changes  # (stats not older)
        reading = stats.link(self._route)
        paced = None if reading is None else reading.pace_bytes_per_s
        if settled and want is not None and paced is not None and paced != want * 1e9 / 8:
            log.info(
                "vLLM connector paced at %g Gbps, not %g: pacing it again", paced * 8 / 1e9, want
            )
            await self.agent.set_pace(want)
        return stats

    # -- life cycle ------------------------------------------------------------------------------
    def spec(self) -> ServerSpec:
        """The server's command line, once the ports and the private folder are known."""
        settings = ConnectorSettings(
            listen_host=self.host,
            listen_port=self.transfer_port,
            agent_socket=self.agent.path,
            kv_budget_mib=self.engine.kv_budget_mib,
            pace_gbps=self._pace_gbps,
            num_connections=NUM_CONNECTIONS,
            link_gbps=self._link_gbps,
            link=self._route,
        )
        return server_spec(
            self.engine,
            settings,
            host="127.0.0.1",
            port=free_port("127.0.0.1"),
            psk=self._deployment.psk,
            owner=owner_tag(self._process_name, self._deployment.psk, self._deployment.control_url),
            kv_events=None if self._agent_dir is None else _kv_events_endpoints(self._agent_dir),
            rpc_dir=self._agent_dir,  # removed in stop(), with the sockets vLLM leaves there
        )

    async def start(self, http_port: int) -> None:
        logging.getLogger("prfaas.vllm").setLevel(logging.INFO)
        self.http_port = http_port
        wanted = max(self._deployment.node(n).transfer_port for n in self._nodes)
        self.transfer_port = wanted or free_port(self.host)
        self._agent_dir = Path(tempfile.mkdtemp(prefix=PRIVATE_FOLDER_PREFIX))  # mode 0700
        self.agent.path = str(self._agent_dir / "agent.sock")
        self.server = VllmServer(self.spec())
        self._endpoint.base_url = self.server.spec.base_url
        if is_cpu_build(self.server.spec.argv[0]):
            self._endpoint.seeded_sampling = False
            log.warning(
                "vLLM's CPU build: a sampled request's seed is not sent to it (its engine dies "
                "on a seeded prompt prefilled in chunks; docs/vllm.md, Seeds)"
            )
        self.spawn(self.server.run())
        if (events := self.server.spec.kv_events) is not None:
            self.kv_events = KvEventSubscriber(events, self._deployment.engine.block_tokens)
            self.spawn(self.kv_events.run(self.server))
        self.spawn(self._poll())
        self.spawn(self._control_plane())

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro)

    async def stop(self) -> None:
        await self._tasks.stop()
        if self.server is not None:  # run()'s finally stopped it; make sure
            await self.server.stop()
        await self._client.aclose()
        if self._agent_dir is not None:
            shutil.rmtree(self._agent_dir, ignore_errors=True)

    def registration(self) -> Registration:
        """The nodes with their first reports: faulty while the server starts."""
        return registration(
            self._process_name,
            self._nodes.values(),
            self.host,
            self.http_port,
            self.transfer_port,
            reports=self.reports(),
        )

    def heartbeat(self) -> Heartbeat:
        """Every node's report and, with prefix caching on, the server's prefix-cache changes
        (one report per process: its nodes share the server, as a worker process's share its
        store)."""
        events = self.kv_events
        prefix = None if events is None else PrefixReportMsg.of(events.translator.report())
        return Heartbeat(
            process=self._process_name,
            reports=self.reports(),
            links=self.link_reports(),
            prefix=prefix,
        )

    def _on_heartbeat_answer(self, r: httpx.Response) -> None:
        """The gateway's acknowledgement of our prefix report (``WorkerHost`` does the same)."""
        if self.kv_events is None:
            return
        try:
            body = r.json()
            ack = body.get("prefix") if isinstance(body, dict) else None
            if ack is not None:
                self.kv_events.translator.acknowledge(PrefixAckMsg.model_validate(ack).to_ack())
        except ValueError as exc:
            log.debug("heartbeat answer without a usable prefix acknowledgement: %s", exc)

    def _on_registered(self) -> None:
        if self.kv_events is not None:  # the gateway mirrors us afresh
            self.kv_events.translator.snapshot()

    async def _control_plane(self) -> None:
        """Register at once (retrying until the gateway answers), then heartbeat; re-register
        when the gateway forgot us (``control_plane.run_control_plane``)."""
        await run_control_plane(
            self._control_url,
            self._auth,
            self._deployment.heartbeat_interval_s,
            log,
            self.registration,
            self.heartbeat,
            on_registered=self._on_registered,
            on_heartbeat_answer=self._on_heartbeat_answer,
            tls=control_tls(self._deployment),
        )


def _kv_events_endpoints(folder: Path) -> KvEventsEndpoints:
    return KvEventsEndpoints(f"ipc://{folder}/kv-events.sock", f"ipc://{folder}/kv-replay.sock")


def _bytes_per_token(model_path: str | None, dtype: str) -> int:
    if model_path is None:
        return 0
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    return kv_bytes_per_token(cfg, dtype) if isinstance(cfg, dict) else 0
