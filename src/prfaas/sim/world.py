"""``World``: the simulated deployment and the state every stage of the simulator shares.

It owns the clock value (``now``, set by the loop), the event queue, the metrics, the sites with
their nodes (``nodes``, ``node_by_id`` and the one pool index ``pools``), decode admission per
site, the links and the prefix caches; it is built from a ``SimScenario``. The stages
(``Simulator`` for arrivals, routing, prefill and links; ``DecodeStage``; ``ControlLoop``) and the
``SimClusterView`` read and change it; none of them knows the others' types. Pure.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable

from prfaas.cache import GlobalKVManager, HybridPrefixCache, sizing_for
from prfaas.core.ids import NodeId, SiteId, link_id_for
from prfaas.core.topology import SiteKind
from prfaas.perf import CostModel, ProfileFileError, cost_model_for_hardware
from prfaas.perf.cost_model import DEFAULT_DECODE_CONTEXT_TOKENS, DEFAULT_DECODE_STEP_BUDGET_S
from prfaas.policy import DecodeAdmission
from prfaas.sim.events import EventKind, EventQueue
from prfaas.sim.kv_bytes import KvBytes
from prfaas.sim.link import Flow, SimLink
from prfaas.sim.metrics import Metrics
from prfaas.sim.nodes import DecodeNode, Pools, PrefillNode, SimNode
from prfaas.sim.plumbing import GatewayCpu, charged_cost_model
from prfaas.sim.processor import SharedCores
from prfaas.sim.request import SimRequest
from prfaas.sim.scenario import ScenarioError, SimScenario, SimSite

_FLOW_DONE = EventKind.FLOW_DONE


class World:
    def __init__(self, scenario: SimScenario) -> None:
        sc = self.sc = scenario
        self.now = 0.0
        self.q = EventQueue()
        self.metrics = Metrics()
        self.stop = False
        """Set by a probe to end the run at once."""
        self.arrivals_done = False
        """The workload is exhausted (the last arrival was scheduled and handled)."""
        self.on_finish: Callable[[SimRequest], None] | None = None
        """Called with each request as it completes (drivers comparing runs request by request)."""
        self._cms: dict[str, CostModel] = {}
        self._node_cms: dict[str, CostModel] = {}
        self.site_ids: tuple[SiteId, ...] = tuple(SiteId(s.name) for s in sc.sites)
        self.site_index = {sid: i for i, sid in enumerate(self.site_ids)}
        self.site_kinds = tuple(SiteKind(s.kind) for s in sc.sites)
        num_sites = len(sc.sites)
        self.nodes: list[SimNode] = []
        self.node_by_id: dict[NodeId, SimNode] = {}
        self.prefill_by_id: dict[NodeId, PrefillNode] = {}
        """``node_by_id``'s prefill nodes (typed: the arrival's lookups need no isinstance)."""
        self.decode_by_id: dict[NodeId, DecodeNode] = {}
        """``node_by_id``'s decode nodes."""
        self.pools = Pools(num_sites)
        self.admission: dict[int, DecodeAdmission] = {}
        """Decode admission of each site that has (or had) decode nodes."""
        cache = self.cost_model(sc.sites[0].hardware).model.cache
        self.kv_bytes = KvBytes(cache)
        self.site_prefilled = [0] * num_sites
        self.site_queued = [0] * num_sites
        self.site_waiting = [0] * num_sites
        self.peak_queued = [0] * num_sites
        self.peak_waiting = [0] * num_sites
        self.shared: list[SharedCores | None] = [self._shared_cores(s) for s in sc.sites]
        """Per site: the cores its nodes share (``SimSite.shared_cores``), or None."""
        self._build_nodes()
        sizing = sizing_for(cache, sc.block_tokens)
        caches: dict[SiteId, HybridPrefixCache] = {}
        for i, s in enumerate(sc.sites):
            num_bytes = int(s.cache_bytes_per_node * max(1, s.num_prefill))
            caches[self.site_ids[i]] = HybridPrefixCache(
                sizing, num_bytes, sc.checkpoint_every_blocks
            )
        self.kv = GlobalKVManager(caches)
        self._build_links()

    def decode_nodes_of(self, site: int) -> list[DecodeNode]:
        """The site's decode nodes now (a few: called only where a site shares its cores)."""
        return [n for n in self.decode_by_id.values() if n.site == site]

    def prefill_nodes_of(self, site: int) -> list[PrefillNode]:
        """The site's prefill nodes now (called only where a site shares its cores)."""
        return [n for n in self.prefill_by_id.values() if n.site == site]

    def cost_model(self, hardware: str) -> CostModel:
        cm = self._cms.get(hardware)
        if cm is None:
            try:  # a preset, or a profile file (perf reads it, once per run and hardware)
                cm = cost_model_for_hardware(self.sc.model, hardware)
            except KeyError as exc:
                raise ScenarioError(str(exc.args[0])) from None
            except ProfileFileError as exc:
                raise ScenarioError(str(exc)) from None
            self._cms[hardware] = cm
        return cm

    def node_cost_model(self, hardware: str) -> CostModel:
        """What the simulated nodes run on: ``cost_model`` with the plumbing terms charged
        (``sim.plumbing``); routers and tuners read ``cost_model``, as the live gateway's do."""
        cm = self._node_cms.get(hardware)
        if cm is None:
            cm = self._node_cms[hardware] = charged_cost_model(
                self.cost_model(hardware), self.sc.plumbing_off
            )
        return cm

    def _shared_cores(self, site: SimSite) -> SharedCores | None:
        """The cores ``site``'s nodes share (``SimSite.shared_cores``), charging its profile's
        ``shared_core_overhead`` while they are time-shared; None: each node on its own."""
        if site.shared_cores is None:
            return None
        overhead = self.node_cost_model(site.hardware).plumbing.shared_core_overhead
        return SharedCores(site.shared_cores, site.threads_per_node, overhead, site.mixed_steps)

    def pin_gateways(self, gateways: dict[int, GatewayCpu | None]) -> None:
        """Charge each home site's gateway (``gateway_cpu``) to the shared cores of the sites
        that host it (``SimSite.hosts_gateway``): their nodes share what it leaves."""
        hosts = [i for i, s in enumerate(self.sc.sites) if s.hosts_gateway]
        pinned = [(h, g) for h, g in gateways.items() if g is not None]
        if not hosts or not pinned:
            return
        for home, gateway in pinned:
            gateway.decode_nodes = functools.partial(self.decode_nodes_of, home)
        shares = tuple(g.share for _, g in pinned)

        def total() -> float:  # several homes' gateways on one site's cores (simulator only)
            return sum(f() for f in shares)

        for i in hosts:
            shared = self.shared[i]
            assert shared is not None  # SimScenario.validate
            shared.gateway_share = shares[0] if len(shares) == 1 else total

    def gateway_cpu(self, site: int) -> GatewayCpu | None:
        """The gateway of home site ``site`` (its plumbing terms from that site's profile), or
        None when no gateway term is charged."""
        p = self.node_cost_model(self.sc.sites[site].hardware).plumbing
        if (
            p.gateway_per_request_s <= 0
            and p.gateway_per_output_token_s <= 0
            and (p.gateway_per_step_s <= 0)
        ):
            return None
        return GatewayCpu(
            p.gateway_per_request_s, p.gateway_per_output_token_s, per_step_s=p.gateway_per_step_s
        )

    def decode_kv_capacity(self, cm: CostModel) -> int:
        """A decode instance's KV budget: a fraction of its HBM."""
        return int(cm.hardware.instance_memory_bytes * self.sc.decode_kv_fraction)

    def _build_nodes(self) -> None:
        for i, s in enumerate(self.sc.sites):
            cm = self.node_cost_model(s.hardware)
            sid = self.site_ids[i]
            for k in range(s.num_prefill):
                self.add_node(PrefillNode(NodeId(f"{s.name}/p{k}"), len(self.nodes), i, sid, cm))
            if s.kind != "pd":
                continue
            bs = s.decode_max_batch or cm.max_decode_batch
            if bs <= 0:
                step_ms = cm.decode_step_s(1, DEFAULT_DECODE_CONTEXT_TOKENS) * 1e3
                raise ScenarioError(
                    f"site {s.name}: {s.hardware} cannot meet the decode SLO (one request's "
                    f"step at {DEFAULT_DECODE_CONTEXT_TOKENS} tokens of context takes "
                    f"{step_ms:.1f} ms, over {DEFAULT_DECODE_STEP_BUDGET_S * 1e3:g} ms); an "
                    "engine that decodes whatever its steps take: give its batch as "
                    "simulation.decode_max_batch"
                )
            self.admission[i] = DecodeAdmission(bs)
            kv_cap = self.decode_kv_capacity(cm)
            for k in range(s.num_decode):
                node_id = NodeId(f"{s.name}/d{k}")
                self.add_node(DecodeNode(node_id, len(self.nodes), i, sid, cm, bs, kv_cap,
                                         s.decode_pads_batch))  # fmt: skip

    def add_node(self, node: SimNode) -> None:
        """Add ``node``, or put it in place of the node with its index (a role change)."""
        if node.index == len(self.nodes):
            self.nodes.append(node)
        else:
            self.nodes[node.index] = node
        self.node_by_id[node.node_id] = node
        if isinstance(node, PrefillNode):
            self.decode_by_id.pop(node.node_id, None)
            self.prefill_by_id[node.node_id] = node
        else:
            self.prefill_by_id.pop(node.node_id, None)
            self.decode_by_id[node.node_id] = node
        self.pools.add(node)

    def _build_links(self) -> None:
        self.links: dict[tuple[int, int], SimLink] = {}
        """One ``SimLink`` per direction, keyed by (source site, destination site)."""
        due = _flow_scheduler(self.q)
        for lc in self.sc.links:
            a, b = self.site_index[SiteId(lc.src)], self.site_index[SiteId(lc.dst)]
            for src, dst in ((a, b), (b, a)):
                lid = link_id_for(self.site_ids[src], self.site_ids[dst])
                self.links[(src, dst)] = SimLink(
                    lid, lc.bytes_per_s, lc.rtt_s, lc.connections, lc.window_bytes,
                    due,
                )  # fmt: skip
            for t_s, gbps in lc.schedule:
                q = self.q
                q.push((t_s, EventKind.CAPACITY, q.next_seq(), a, b, gbps))
        self.link_by_name = {
            (self.site_ids[a], self.site_ids[b]): link for (a, b), link in self.links.items()
        }

    def idle_for_good(self) -> bool:
        """No arrival to come and nothing in flight: periodic events may stop."""
        m = self.metrics
        return self.arrivals_done and m.num_arrived == m.num_completed + m.num_failed


def _flow_scheduler(q: EventQueue) -> Callable[[float, Flow, int], None]:
    """The links' ``schedule_done``: pushes a FLOW_DONE event onto ``q`` (its heap and counter
    are never replaced, so the closure holds them: one call per rate change, no lookups)."""
    heap, seq, push = q.heap, q.seq, heapq.heappush

    def due(time_s: float, flow: Flow, version: int) -> None:
        push(heap, (time_s, _FLOW_DONE, next(seq), flow, version))

    return due
