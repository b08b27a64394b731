"""``Simulator``: the discrete-event driver. It owns simulated nodes, links and caches, and asks
the ``policy/`` objects for every decision (routing, batching, decode admission, threshold
re-search, rebalancing) through a ``SimClusterView``: the same objects the live gateway uses.

A request's life, in events: ARRIVAL (route; maybe a cache move over a link) -> queued at a
prefill node -> batch start (decode node chosen, KV transfer starts with the first layer) ->
PREFILL_DONE (prefix stored in the site cache; last layer released) -> FLOW_DONE / KV_ARRIVE
(first token: TTFT) -> decode join at a step boundary -> DECODE_TICK when it completes. Decode
completion times are computed from ``CostModel.decode_span_s`` between batch membership changes,
so events grow with requests, not tokens. Pure: no clock reads, no I/O (the trace reader is
called through the workload iterator it is given).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

from prfaas.cache import GlobalKVManager, HybridPrefixCache, sizing_for
from prfaas.core.ids import NodeId, RequestId, SiteId, link_id_for
from prfaas.core.topology import NodeRole, SiteKind
from prfaas.core.views import RequestView
from prfaas.perf import CostModel, cost_model_for
from prfaas.policy import (
    DecodeAdmission,
    LengthWindow,
    NoRouteError,
    PrefillBatcher,
    Rebalancer,
    ThresholdTuner,
    make_router,
)
from prfaas.sim import events as ev
from prfaas.sim.control import ControlDriver
from prfaas.sim.decode_driver import DecodeDriver
from prfaas.sim.link import Flow, SimLink
from prfaas.sim.metrics import Metrics
from prfaas.sim.nodes import DecodeNode, PoolIndex, PrefillNode, SimNode
from prfaas.sim.request import SimRequest
from prfaas.sim.scenario import ScenarioError, SimScenario
from prfaas.sim.view import SimClusterView
from prfaas.spec.cache_spec import LayerKind
from prfaas.workload import (
    FixedLengths,
    SimRequestSpec,
    TruncatedLogNormal,
    read_mooncake,
    synthetic_requests,
    trace_requests,
)

_PREFILL = NodeRole.PREFILL
_DECODE = NodeRole.DECODE


class Simulator(DecodeDriver, ControlDriver):
    def __init__(self, scenario: SimScenario, requests: Iterator[SimRequestSpec] | None = None):
        scenario.validate()
        self.sc = scenario
        self.now = 0.0
        self.q = ev.EventQueue()
        self.metrics = Metrics()
        self.num_events = 0
        self._build_sites()
        self._build_links()
        self._build_policies()
        self._index_pools()
        self._requests = requests if requests is not None else self._workload()
        self.probe: Callable[[Simulator], None] | None = None
        self.on_finish: Callable[[SimRequest], None] | None = None
        """Called with each request as it completes (drivers comparing runs request by request)."""
        self.stop = False
        self._primed = False
        self.arrivals_done = False
        self.last_arrival_s = 0.0

    # -- construction ----------------------------------------------------------------------------
    def _cm(self, hardware: str) -> CostModel:
        key = hardware
        cm = self._cms.get(key)
        if cm is None:
            try:
                cm = cost_model_for(self.sc.model, hardware)
            except KeyError as exc:
                raise ScenarioError(str(exc.args[0])) from None
            self._cms[key] = cm
        return cm

    def _build_sites(self) -> None:
        sc = self.sc
        self._cms: dict[str, CostModel] = {}
        self.site_ids: tuple[SiteId, ...] = tuple(SiteId(s.name) for s in sc.sites)
        self.site_index = {sid: i for i, sid in enumerate(self.site_ids)}
        self.site_kinds = tuple(SiteKind(s.kind) for s in sc.sites)
        self.nodes: list[SimNode] = []
        self.node_by_id: dict[NodeId, SimNode] = {}
        self.pools: dict[tuple[int, NodeRole], PoolIndex] = {}
        self._prefill_by_name: dict[SiteId, PoolIndex] = {}
        self._decode_by_name: dict[SiteId, PoolIndex] = {}
        self._num_indexed = -1
        self.prefill_pools: list[PoolIndex | None] = []
        self.decode_pools: list[PoolIndex | None] = []
        self.admission: dict[int, DecodeAdmission] = {}
        model_cache = self._cm(sc.sites[0].hardware).model.cache
        self.kv_fixed = 0
        for layer in model_cache.layers:
            if layer.kind is LayerKind.LINEAR:
                self.kv_fixed += layer.fixed_bytes
            elif layer.kind is LayerKind.SWA:
                assert layer.window_tokens is not None
                self.kv_fixed += layer.window_tokens * layer.bytes_per_token
        self.kv_per_token = model_cache.full_attention_bytes_per_token
        self.num_layers = model_cache.num_layers
        sizing = sizing_for(model_cache, sc.block_tokens)
        caches = {}
        for i, s in enumerate(sc.sites):
            cm = self._cm(s.hardware)
            sid = self.site_ids[i]
            self.pools[(i, _PREFILL)] = PoolIndex()
            for k in range(s.num_prefill):
                self._add_node(PrefillNode(NodeId(f"{s.name}/p{k}"), len(self.nodes), i, sid, cm))
            if s.kind == "pd":
                self.pools[(i, _DECODE)] = PoolIndex()
                bs = cm.max_decode_batch
                if bs <= 0:
                    raise ScenarioError(f"site {s.name}: {s.hardware} cannot meet the decode SLO")
                self.admission[i] = DecodeAdmission(bs)
                kv_cap = int(cm.hardware.instance_memory_bytes * sc.decode_kv_fraction)
                for k in range(s.num_decode):
                    node = DecodeNode(
                        NodeId(f"{s.name}/d{k}"), len(self.nodes), i, sid, cm, bs, kv_cap
                    )
                    self._add_node(node)
            nodes_here = max(1, s.num_prefill)
            caches[sid] = HybridPrefixCache(
                sizing, int(s.cache_bytes_per_node * nodes_here), sc.checkpoint_every_blocks
            )
        self.kv = GlobalKVManager(caches)
        self.site_prefilled = [0] * len(sc.sites)
        self.site_queued = [0] * len(sc.sites)
        self.site_waiting = [0] * len(sc.sites)
        self.peak_queued = [0] * len(sc.sites)
        self.peak_waiting = [0] * len(sc.sites)
        self.batcher = PrefillBatcher(sc.prefill_token_budget)

    def pool(self, site_id: SiteId, role: NodeRole) -> PoolIndex | None:
        """The pool of ``role`` nodes at ``site_id`` (no enum hashing: this is a hot path)."""
        if self._num_indexed != len(self.pools):
            self._index_pools()
        names = self._prefill_by_name if role is _PREFILL else self._decode_by_name
        return names.get(site_id)

    def _index_pools(self) -> None:
        self._prefill_by_name = {}
        self._decode_by_name = {}
        self._num_indexed = len(self.pools)
        for (s, role), pool in self.pools.items():
            target = self._prefill_by_name if role is _PREFILL else self._decode_by_name
            target[self.site_ids[s]] = pool
        self.prefill_pools = [self.pools.get((i, _PREFILL)) for i in range(len(self.site_ids))]
        self.decode_pools = [self.pools.get((i, _DECODE)) for i in range(len(self.site_ids))]

    def _add_node(self, node: SimNode) -> None:
        self.nodes.append(node)
        self.node_by_id[node.node_id] = node
        self.pools[(node.site, node.role)].add(node)

    def _build_links(self) -> None:
        self.links: dict[tuple[int, int], SimLink] = {}
        for lc in self.sc.links:
            a, b = self.site_index[SiteId(lc.src)], self.site_index[SiteId(lc.dst)]
            for src, dst in ((a, b), (b, a)):
                lid = link_id_for(self.site_ids[src], self.site_ids[dst])
                self.links[(src, dst)] = SimLink(
                    lid, lc.bandwidth_gbps * 1e9 / 8, lc.rtt_s, lc.connections, lc.window_bytes,
                    self.q.push, ev.FLOW_DONE,
                )  # fmt: skip
            for t_s, gbps in lc.schedule:
                self.q.push(t_s, ev.CAPACITY, (a, b), gbps)
        self._last_bytes = {k: 0.0 for k in self.links}
        self.link_by_name = {
            (self.site_ids[a], self.site_ids[b]): link for (a, b), link in self.links.items()
        }

    def _build_policies(self) -> None:
        sc = self.sc
        remote = [self.site_ids[i] for i, k in enumerate(self.site_kinds) if k is SiteKind.PRFAAS]
        self.homes = [i for i, k in enumerate(self.site_kinds) if k is SiteKind.PD]
        self.routers = {}
        self.views = {}
        self.tuners = {}
        self.rebalancers = {}
        self.windows = {}
        tune = sc.tune if sc.tune is not None else sc.policy == "prfaas"
        remote_cm = self._cm(sc.sites[self.site_index[remote[0]]].hardware) if remote else None
        for h in self.homes:
            reach = [r for r in remote if (self.site_index[r], h) in self.links]
            local = self._cm(sc.sites[h].hardware)
            self.routers[h] = make_router(
                sc.policy, self.site_ids[h], reach, None, remote_cm, local
            )
            self.views[h] = SimClusterView(self, sc.threshold_tokens)
            self.windows[h] = LengthWindow()
            if tune and reach:
                self.tuners[h] = ThresholdTuner(self.site_ids[h], reach, remote_cm, local)
            if sc.rebalance:
                self.rebalancers[h] = Rebalancer(self.site_ids[h], reach, remote_cm, local)
        if self.tuners or self.rebalancers:
            self.q.push(sc.control_interval_s, ev.CONTROL)
        if sc.timeseries:
            self.q.push(0.0, ev.SAMPLE)

    def _workload(self) -> Iterator[SimRequestSpec]:
        sc = self.sc
        rng = random.Random(sc.seed)
        homes = sum(1 for s in sc.sites if s.kind == "pd")
        if sc.trace is not None:
            records = read_mooncake(sc.trace, sc.trace_limit)
            return trace_requests(
                records, rate_scale=sc.rate_scale, duration_s=sc.duration_s, num_home_sites=homes
            )
        lc = sc.lengths
        dist: Any
        if lc.kind == "fixed":
            dist = FixedLengths(lc.fixed_tokens)
        else:
            dist = TruncatedLogNormal(lc.mu, lc.sigma, lc.min_tokens, lc.max_tokens)
        return synthetic_requests(
            sc.arrival, dist, sc.output_tokens, sc.duration_s, rng,
            stratified=sc.stratified, num_home_sites=homes,
        )  # fmt: skip

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, until_s: float | None = None) -> Metrics:
        horizon = until_s if until_s is not None else self.sc.duration_s + self.sc.drain_s
        if not self._primed:
            self._primed = True
            self._next_arrival()
        q = self.q
        handlers: list[Callable[[Any, Any], None]] = [
            self._on_capacity, self._on_flow_done, self._on_prefill_done, self._on_kv_arrive,
            self._on_decode_tick, self._on_convert, self._on_arrival, self._on_control,
            self._on_sample, self._on_probe,
        ]  # fmt: skip
        n = 0
        heap = q.heap
        pop = heapq.heappop
        while heap and heap[0][0] <= horizon and not self.stop:
            t, kind, _, a, b = pop(heap)
            self.now = t
            handlers[kind](a, b)
            n += 1
        self.num_events += n
        return self.metrics

    @property
    def done(self) -> bool:
        return self.stop or (self._primed and not len(self.q))

    def _next_arrival(self) -> None:
        spec = next(self._requests, None)
        if spec is None:
            self.last_arrival_s = self.now
            self.arrivals_done = True
            return
        home = self.homes[spec.home_site % len(self.homes)]
        req = SimRequest(
            spec.index, spec.arrival_s, spec.num_prompt_tokens, spec.num_output_tokens,
            spec.block_hashes, home,
        )  # fmt: skip
        self.q.push(spec.arrival_s, ev.ARRIVAL, req)

    # -- arrival and routing -----------------------------------------------------------------------
    def _on_arrival(self, req: SimRequest, _: Any) -> None:
        self._next_arrival()
        m = self.metrics
        m.num_arrived += 1
        sc = self.sc
        home = req.home
        hashes = req.block_hashes if sc.prefix_cache else ()
        cached = self.kv.peek(hashes, req.num_prompt) if hashes else {}
        # RequestId is a NewType: the plain str is the same object at run time, minus a call.
        rid: RequestId = f"r{req.index}"  # type: ignore[assignment]
        view = RequestView(rid, req.num_prompt, cached, hashes, req.num_output)  # type: ignore[arg-type]
        try:
            d = self.routers[home].route(view, self.views[home], self.now)
        except NoRouteError:
            m.num_failed += 1
            return
        site = self.site_index[d.prefill_site]
        node = self.node_by_id[d.prefill_node]
        req.cached_home = cached.get(self.site_ids[home], 0)
        req.offloaded = d.offloaded
        req.rerouted = d.rerouted
        if d.offloaded:
            m.num_offloaded += 1
        if d.rerouted:
            m.num_rerouted += 1
        move = d.cache_move
        if move is not None and move.num_tokens > 0:
            src, dst = self.site_index[move.src_site], self.site_index[move.dst_site]
            link = self.links.get((src, dst))
            if link is not None and link.capacity > 0:
                m.num_cache_moves += 1
                req.num_cached = d.num_cached_tokens
                nbytes = self.kv_fixed + move.num_tokens * self.kv_per_token
                link.add(self.now, nbytes, 0.0, ("move", req, node, dst), self.num_layers)
                self.windows[home].observe(
                    req.num_prompt - req.num_cached, req.num_output, self.now
                )
                return
        # What the prefill site really reuses (refreshes its LRU, counts its hit rate); no cache
        # changed since the peek, so its figure for that site holds.
        peeked = cached.get(d.prefill_site, 0)
        req.num_cached = min(
            d.num_cached_tokens, self.kv.use(d.prefill_site, hashes, req.num_prompt, peeked)
        )
        self.windows[home].observe(req.num_prompt - req.num_cached, req.num_output, self.now)
        self._assign(req, node, site)

    def _assign(self, req: SimRequest, node: Any, site: int) -> None:
        uncached = req.num_prompt - req.num_cached
        svc = node.cm.prefill_s(uncached, req.num_cached)
        req.work_s = svc
        now = self.now
        node.free_at_s = (node.free_at_s if node.free_at_s > now else now) + svc
        node.queue.append(req)
        node.queued_tokens += uncached
        self.site_queued[site] += 1
        if self.site_queued[site] > self.peak_queued[site]:
            self.peak_queued[site] = self.site_queued[site]
        self.prefill_pools[site].touch(node)  # type: ignore[union-attr]
        if not node.busy:
            self._start_batch(node)

    # -- prefill ----------------------------------------------------------------------------------
    def _start_batch(self, node: PrefillNode) -> None:
        queue = node.queue
        if len(queue) == 1:  # the batcher's rule for a lone request: it goes, alone
            batch = [queue.popleft()]
            node.queued_tokens -= batch[0].num_prompt - batch[0].num_cached
        else:
            head = [r.num_prompt - r.num_cached for r in itertools.islice(queue, 64)]
            batch_plan = self.batcher.next_batch(head)
            batch = [queue.popleft() for _ in range(batch_plan.num_requests)]
            node.queued_tokens -= batch_plan.num_tokens
        node.cached_load = None
        self.site_queued[node.site] -= len(batch)
        # Sum of per-request times == CostModel.batch_prefill_s for the shipped profiles.
        duration = sum(r.work_s for r in batch)
        now = self.now
        node.busy = True
        node.busy_s += duration
        for req in batch:
            req.prefill_start_s = now
            req.prefill_node = node
            self._start_transfer(req, node, duration)
        self.q.push(now + duration, ev.PREFILL_DONE, node, batch)

    def _start_transfer(self, req: SimRequest, node: PrefillNode, duration: float) -> None:
        home = req.home
        # ``policy.least_loaded``'s rule for decode placement (fewest requests running, waiting
        # or reserved), answered by the pool's heap without building a NodeLoad (hot path).
        dec: Any = self.decode_pools[home].best()  # type: ignore[union-attr]
        if dec is None:
            raise ScenarioError(f"site {self.site_ids[home]}: no decode node accepts work")
        dec.reserved += 1
        self.decode_pools[home].touch(dec)  # type: ignore[union-attr]
        req.decode_node = dec
        req.kv_bytes = self.kv_fixed + (req.num_prompt + req.num_output) * self.kv_per_token
        if node.site == home:
            req.transfer_bytes = 0
            return
        nbytes = self.kv_fixed + (req.num_prompt - req.cached_home) * self.kv_per_token
        req.transfer_bytes = nbytes
        link = self.links[(node.site, home)]
        req.flow = link.add(self.now, nbytes, duration, ("kv", req), self.num_layers)

    def _on_prefill_done(self, node: PrefillNode, batch: list[SimRequest]) -> None:
        now = self.now
        node.busy = False
        node.cached_load = None
        site = node.site
        sid = self.site_ids[site]
        local_rate = self.sc.local_fabric_gbps * 1e9 / 8
        for req in batch:
            req.prefill_end_s = now
            self.site_prefilled[site] += 1
            if req.block_hashes and self.sc.prefix_cache:
                self.kv.store(sid, req.block_hashes, req.num_prompt)
            if req.transfer_bytes:
                if req.flow is not None:
                    req.flow.link.produced(req.flow, now)
            else:
                last_layer = (self.kv_fixed + req.num_prompt * self.kv_per_token) / self.num_layers
                self.q.push(now + last_layer / local_rate, ev.KV_ARRIVE, req)
        if node.queue:
            self._start_batch(node)
        elif node.draining:
            self._drained(node)

    # -- links ------------------------------------------------------------------------------------
    def _on_flow_done(self, flow: Flow, version: int) -> None:
        if flow.version != version or flow.finished:
            return
        link = flow.link
        link.finish(flow, self.now)
        payload: Any = flow.payload
        delay = link.rtt_s / 2
        if payload[0] == "kv":
            req = payload[1]
            req.flow = None
            if delay > 0:
                self.q.push(self.now + delay, ev.KV_ARRIVE, req)
            else:
                self._on_kv_arrive(req, None)
        else:
            _, req, node, dst = payload
            self.kv.store(self.site_ids[dst], req.block_hashes, req.num_cached + 1)
            req.num_cached = min(
                req.num_cached, self.kv.use(self.site_ids[dst], req.block_hashes, req.num_prompt)
            )
            self._assign(req, node, dst)

    def _on_capacity(self, pair: tuple[int, int], gbps: float) -> None:
        for key in (pair, (pair[1], pair[0])):
            self.links[key].set_capacity(self.now, gbps * 1e9 / 8)

    def schedule_probe(self, at_s: float, fn: Callable[[Simulator], None]) -> None:
        """Call ``fn(self)`` at ``at_s`` (after everything else due then); ``--find-max-rate``."""
        self.probe = fn
        self.q.push(at_s, ev.PROBE)
