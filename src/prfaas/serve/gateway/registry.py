"""``NodeRegistry``: the gateway's control plane. Nodes register and heartbeat their load; the
registry keeps the policy's ``MutableClusterView`` up to date one report at a time, derives each
inter-site link's ``LinkState`` from the PrfaaS nodes' egress counters, and takes a node whose
process stopped heartbeating out of rotation.

A link's capacity is what the PrfaaS site's senders measured (each process's
``core.link_estimate`` estimate in its reports; the highest of the site's live processes: each
measures a lower bound of the one link they share), the deployment file's rate until one has
measured (basis "configured"), and the reported paced rate for nodes that do not estimate.

Units: the view is in *modelled* units, like the simulator's: seconds of the emulated hardware
(wall seconds / time_scale) and real KV bytes (payload bytes x byte_divisor), so the same policy
objects and thresholds apply to both drivers. Byte counts are converted with each site's own
engine (a vLLM or torch site sends real bytes even under a top-level ``timed`` engine); a
heartbeat's link readings (``core.SenderLinkReport``) come converted by the process that sent
them.

Whether a node takes new work is its ``Rotation`` (``rotation.py``: the reasons and the way back
from each); the view's ``healthy`` and ``draining`` flags are derived from it on every change.

The prefix cache the router sees is ``kv``, a ``cache.KVMirror`` of every process's prefix store
(one store per worker process): a registration starts its mirror afresh, each heartbeat's prefix
report is applied to it (the acknowledgement goes back in the heartbeat's answer), a silent
process's mirror is dropped with its nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from prfaas.cache.mirror import KVMirror, ReportAck
from prfaas.config import DeploymentConfig
from prfaas.core import LinkState, MutableClusterView, NodeId, NodeLoad, NodeRole, SiteId, SiteKind
from prfaas.core.congestion import CongestionRule
from prfaas.core.ids import link_id_for
from prfaas.core.link_config import LinkConfig
from prfaas.core.link_estimate import DeliveredRate
from prfaas.core.link_report import SenderLinkReport
from prfaas.serve.gateway.rotation import Rotation
from prfaas.serve.node.messages import Heartbeat, NodeEndpoint, NodeReport, Registration

CONGESTION = CongestionRule()
"""The one congestion rule (``core/congestion.py``), with what the gateway measures."""


@dataclass
class _Process:
    name: str
    nodes: list[str]
    last_seen_wall_s: float
    alive: bool = True


@dataclass
class _LinkMeter:
    capacity_bytes_per_s: float
    goodput: DeliveredRate
    """Delivered bytes averaged as the simulator's link averages them (modelled units)."""
    delivered_bytes: float = 0.0
    """Modelled bytes the site's senders have delivered so far (kept non-decreasing)."""
    per_node_bytes: dict[str, int] = field(default_factory=dict)
    per_process: dict[str, _ProcessLink] = field(default_factory=dict)
    """What each of the site's processes last said about its senders (estimating ones only)."""


@dataclass(frozen=True, slots=True)
class _ProcessLink:
    estimate_bytes_per_s: float
    basis: str
    backlog_bytes: int
    """Accepted by the process's senders and not acknowledged, plus what its nodes' open
    transfers have not handed to the senders yet (modelled bytes)."""
    unacked_bytes: int
    """The senders' part alone: handed over, not yet acknowledged (modelled bytes)."""
    at_wall_s: float


class NodeRegistry:
    def __init__(self, deployment: DeploymentConfig, view: MutableClusterView) -> None:
        self.deployment = deployment
        self.view = view
        eng = deployment.engine
        # The gateway's clock: modelled seconds of the deployment (only the timed engine scales).
        self.time_scale = eng.wall_s_per_modelled_s
        # Bytes: each site's own engine, as its nodes convert (serve/node/host.py).
        self.byte_divisors = {
            s.name: deployment.engine_for(s.name).real_bytes_per_payload_byte
            for s in deployment.sites
        }
        self.endpoints: dict[str, NodeEndpoint] = {}
        # Work the gateway itself has sent and not seen finish, per node: request -> tokens.
        # Authoritative for queues between heartbeats (a heartbeat is up to an interval old, and
        # a burst routed on stale loads would pile onto one node).
        self._pending: dict[str, dict[str, int]] = {}
        self._rotation: dict[str, Rotation] = {}
        self.last_report: dict[str, NodeReport] = {}
        """Each node's last report as it came (``/internal/nodes``: its KV handshakes refused,
        decode steps, and its own queue, which for a prefill node counts the commands that
        reached it; the view's queue depth counts them from their dispatch)."""
        self.processes: dict[str, _Process] = {}
        self._site_kind = {s.name: s.kind for s in deployment.sites}
        # A pending entry (a prefill's store, before the reports cover it) outlives no process.
        self.kv = KVMirror(
            [SiteId(s.name) for s in deployment.sites], deployment.gateway.heartbeat_timeout_s
        )
        """What every process's prefix store holds, as its heartbeats report it."""
        self._acks: dict[str, ReportAck] = {}
        home = deployment.home_site.name
        self._meters = {
            s.name: _LinkMeter(_home_link(deployment, s.name).gbps * 1e9 / 8, DeliveredRate())
            for s in deployment.sites
            if s.kind == "prfaas"
        }
        for site, meter in self._meters.items():
            view.update_link(
                LinkState(link_id_for(SiteId(site), SiteId(home)), meter.capacity_bytes_per_s)
            )

    # -- clocks and units -------------------------------------------------------------------------
    def modelled_s(self, wall_s: float) -> float:
        return wall_s / self.time_scale

    # -- registration and heartbeats --------------------------------------------------------------
    def register(self, reg: Registration, now_wall_s: float) -> None:
        for ep in reg.nodes:
            if ep.site not in self._site_kind:
                raise ValueError(f"node {ep.node} reports unknown site {ep.site}")
        names = [ep.node for ep in reg.nodes]
        for proc in list(self.processes.values()):  # a node belongs to one process: the newest
            if proc.name != reg.process:
                proc.nodes = [n for n in proc.nodes if n not in names]
                if not proc.nodes:
                    del self.processes[proc.name]
                    self.kv.forget(proc.name)
        self.processes[reg.process] = _Process(reg.process, names, now_wall_s)
        if reg.nodes:  # one site per process; its store is mirrored from its next snapshot
            self.kv.track(reg.process, SiteId(reg.nodes[0].site))
        first = {r.node: r for r in reg.reports}
        for ep in reg.nodes:
            self.endpoints[ep.node] = ep
            blank = NodeReport(node=ep.node, site=ep.site, role=ep.role)
            self._update(first.get(ep.node, blank), now_wall_s)

    def heartbeat(self, beat: Heartbeat, now_wall_s: float) -> bool:
        """False when the process is unknown (the node re-registers)."""
        proc = self.processes.get(beat.process)
        if proc is None or not proc.alive:
            return False
        proc.last_seen_wall_s = now_wall_s
        for report in beat.reports:
            if report.node in self.endpoints:
                self.endpoints[report.node] = self.endpoints[report.node].model_copy(
                    update={"role": report.role}
                )
                self._update(report, now_wall_s)
        self._update_links(beat.reports, beat.links, now_wall_s, beat.process)
        if beat.prefix is not None:
            ack = self.kv.apply(beat.process, beat.prefix.to_report(), now_wall_s)
            if ack is not None:
                self._acks[beat.process] = ack
        return True

    def take_prefix_ack(self, process: str) -> ReportAck | None:
        """The acknowledgement of the process's last prefix report, for the heartbeat's answer
        (once: a heartbeat without a report gets none)."""
        return self._acks.pop(process, None)

    def process_of(self, node: str) -> str | None:
        """The worker process hosting the node (its prefix store's id in ``kv``)."""
        return next((p.name for p in self.processes.values() if node in p.nodes), None)

    def expire(self, now_wall_s: float) -> list[str]:
        """Take nodes whose process stopped heartbeating out of rotation; returns their names."""
        gone: list[str] = []
        timeout = self.deployment.gateway.heartbeat_timeout_s
        for proc in self.processes.values():
            if proc.alive and now_wall_s - proc.last_seen_wall_s > timeout:
                proc.alive = False
                gone.extend(proc.nodes)
        for proc in [p for p in self.processes.values() if not p.alive]:
            del self.processes[proc.name]
            self.kv.forget(proc.name)
            self._acks.pop(proc.name, None)
        for name in gone:
            self._rotation[name].on_silent()
            self._refresh(name)
        return gone

    # -- rotation ---------------------------------------------------------------------------------
    def mark_unreachable(self, node: str, reason: str, now_wall_s: float) -> None:
        """The gateway could not reach the node: out until a heartbeat after its quarantine."""
        if (rot := self._rotation.get(node)) is not None:
            rot.on_unreachable(reason, now_wall_s)
            self._refresh(node)

    def mark_refused(self, node: str, now_wall_s: float) -> None:
        """The node answered "not now" (409): out until a report sent after the refusal."""
        if (rot := self._rotation.get(node)) is not None:
            rot.on_refused(now_wall_s, self.deployment.heartbeat_interval_s)
            self._refresh(node)

    def mark_switching(self, node: str) -> None:
        """Asked to change role: out until the node reports draining or its new role (a report
        sent before it heard of the change must not put it back)."""
        if (rot := self._rotation.get(node)) is not None:
            rot.on_switch()
            self._refresh(node)

    def record_success(self, node: str) -> None:
        """A request completed at the node: its retry budget is whole again."""
        if (rot := self._rotation.get(node)) is not None:
            rot.on_success()

    def drain(self, node: str) -> None:
        """An operator takes the node out of rotation until ``resume``."""
        self._rotation_or_raise(node).drained = True
        self._refresh(node)

    def resume(self, node: str) -> None:
        self._rotation_or_raise(node).drained = False
        self._refresh(node)

    def rotation(self, node: str) -> tuple[bool, str]:
        """(in rotation, why not) for ``prfaas status``."""
        rot = self._rotation_or_raise(node)
        why = rot.why_not()
        return not why, why

    def in_flight(self, node: str) -> int:
        """Requests the gateway sent to the node that have not finished there."""
        return len(self._pending.get(node, {}))

    def alive(self, node: str) -> bool:
        rot = self._rotation.get(node)
        return rot is not None and rot.healthy

    def _rotation_or_raise(self, node: str) -> Rotation:
        rot = self._rotation.get(node)
        if rot is None:
            raise KeyError(f"no node named {node!r} has registered")
        return rot

    # -- the gateway's own accounting of dispatched work ----------------------------------------
    def track(self, node: str, request_id: str, tokens: int) -> None:
        self._pending.setdefault(node, {})[request_id] = tokens
        self._refresh(node)

    def untrack(self, node: str, request_id: str) -> None:
        if self._pending.get(node, {}).pop(request_id, None) is not None:
            self._refresh(node)

    def _refresh(self, node: str) -> None:
        try:
            load = self.view.node(NodeId(node))
        except KeyError:
            return
        rot = self._rotation.get(node)
        if rot is not None:
            load = replace(load, healthy=rot.healthy, draining=rot.held)
        self.view.update_node(self._with_pending(load))

    def _with_pending(self, load: NodeLoad) -> NodeLoad:
        work = self._pending.get(load.node_id, {})
        if load.role is NodeRole.PREFILL:
            return replace(load, queue_depth=len(work), queued_tokens=sum(work.values()))
        # The requests this gateway placed there and has not seen end (exact, no heartbeat lag)
        # make running + waiting, as the simulator's running + waiting + reserved: the report's
        # queue depth (KV yet to arrive) is the part of them not running yet.
        return replace(load, batch_size=max(0, len(work) - load.queue_depth))

    def _update(self, r: NodeReport, now_wall_s: float) -> None:
        role = NodeRole(r.role)
        rot = self._rotation.setdefault(r.node, Rotation(role))
        rot.on_report(role, r.draining, r.fault, now_wall_s)
        self.last_report[r.node] = r
        self.view.update_node(
            self._with_pending(NodeLoad(
                node_id=NodeId(r.node),
                site_id=SiteId(r.site),
                role=role,
                queue_depth=r.queue_depth,
                queued_tokens=r.queued_tokens,
                batch_size=r.batch_size,
                kv_used_bytes=r.kv_used_bytes,
                kv_capacity_bytes=r.kv_capacity_bytes,
                draining=rot.held,
                healthy=rot.healthy,
                sampled_at_s=self.modelled_s(now_wall_s),
            ))
        )  # fmt: skip

    def _update_links(
        self,
        reports: list[NodeReport],
        links: list[SenderLinkReport],
        now_wall_s: float,
        process: str = "",
    ) -> None:
        """The site's ``LinkState`` after one process's reports, measured as the simulator's
        link measures its own: backlog = KV accepted for the link and not yet delivered (a
        transfer counts whole from its first layer: the nodes' unsent bytes plus the senders'
        unacknowledged ones); goodput = delivered bytes (those the senders accepted, credited
        per piece, less the unacknowledged) through the same ``DeliveredRate`` filter;
        utilisation = goodput over the capacity in use. All in modelled units."""
        home = self.deployment.home_site.name
        for site, meter in self._meters.items():
            mine = [r for r in reports if r.site == site]
            if not mine:
                continue
            for r in mine:
                meter.per_node_bytes[r.node] = r.egress_bytes
            divisor = self.byte_divisors[site]
            accepted = sum(meter.per_node_bytes.values()) * divisor
            unsent = sum(r.egress_backlog_bytes for r in mine) * divisor
            link_id = link_id_for(SiteId(site), SiteId(home))
            reading = next((lk for lk in links if lk.link == link_id), None)
            if reading is not None and reading.configured_bytes_per_s > 0:
                # the rate the site's sender is paced at now (modelled bytes/s)
                meter.capacity_bytes_per_s = reading.configured_bytes_per_s
            cap, basis, backlogs = self._measured(meter, reading, unsent, process, now_wall_s)
            if backlogs is None:  # senders that do not count: the nodes' figure is the backlog
                backlog, unacked = unsent, 0
            else:
                backlog, unacked = backlogs
            # Counters restart with a process: delivered bytes never go back (the filter's
            # input is cumulative).
            meter.delivered_bytes = max(meter.delivered_bytes, float(accepted - unacked))
            now = self.modelled_s(now_wall_s)
            goodput = meter.goodput.observe(now, meter.delivered_bytes)
            utilisation = goodput / cap if cap > 0 else 0.0
            # Loss is the worst retransmit rate the nodes' transfer monitors saw; their queueing
            # (wall-clock RTT) is not used: a busy emulation host inflates it.
            retransmit_rate = 0.0 if reading is None else reading.retransmit_rate
            drain = backlog / cap if cap > 0 else (float("inf") if backlog else 0.0)
            congested = CONGESTION.congested(utilisation, drain, retransmit_rate)
            self.view.update_link(
                LinkState(
                    link_id=link_id,
                    capacity_bytes_per_s=cap,
                    utilisation=utilisation,
                    goodput_bytes_per_s=goodput,
                    backlog_bytes=backlog,
                    rtt_s=0.0 if reading is None else reading.rtt_s,
                    retransmit_rate=retransmit_rate,
                    congested=congested,
                    sampled_at_s=now,
                    capacity_basis=basis,
                )
            )

    def _measured(
        self, meter: _LinkMeter, reading: SenderLinkReport | None, unsent: int, process: str,
        now_wall_s: float,
    ) -> tuple[float, str, tuple[int, int] | None]:  # fmt: skip
        """(capacity, its basis, (backlog, unacknowledged) or None) for a site from its
        processes' estimates; ``reading`` is this process's of the site's link, ``unsent`` what
        its nodes have not handed over yet. A process silent for longer than the heartbeat
        timeout no longer counts."""
        if reading is not None and reading.basis:
            meter.per_process[process] = _ProcessLink(
                reading.capacity_bytes_per_s, reading.basis,
                reading.backlog_bytes + unsent, reading.backlog_bytes, now_wall_s,
            )  # fmt: skip
        horizon = now_wall_s - self.deployment.gateway.heartbeat_timeout_s
        live = [p for p in meter.per_process.values() if p.at_wall_s >= horizon]
        measured = [p.estimate_bytes_per_s for p in live if p.basis == "measured"]
        links = (
            (sum(p.backlog_bytes for p in live), sum(p.unacked_bytes for p in live))
            if live
            else None
        )
        if measured:
            return max(measured), "measured", links
        return meter.capacity_bytes_per_s, "configured", links

    def link_states(self) -> list[LinkState]:
        home = SiteId(self.deployment.home_site.name)
        out = []
        for site in self._meters:
            state = self.view.link(SiteId(site), home)
            if state is not None:
                out.append(state)
        return out

    def site_kinds(self) -> dict[SiteId, SiteKind]:
        return {SiteId(k): SiteKind(v) for k, v in self._site_kind.items()}


def _home_link(deployment: DeploymentConfig, site: str) -> LinkConfig:
    """The PrfaaS site's link to the home site (the deployment file's validation requires one)."""
    link = deployment.link_to_home(site)
    if link is None:
        raise ValueError(f"PrfaaS site {site} has no link to the home site")
    return link
