"""``Simulator``: the discrete-event driver. It builds the ``World`` (nodes, links, caches) and
owns the stages that move it: arrivals, routing, prefill and links here; decode in
``DecodeStage`` (``decode.py``); control and observation in ``ControlLoop`` (``control.py``).
Every decision (routing, batching, decode admission, threshold re-search, rebalancing) is asked
of the ``policy/`` objects through a ``SimClusterView``: the same objects the live gateway uses.

A request's life, in events: ARRIVAL (route, decode node chosen and reserved by
``policy.DecodePlacement`` as the live gateway does; maybe a cache move over a link) -> queued at
a prefill node -> batch start (KV transfer starts with the first layer) ->
PREFILL_DONE (prefix stored in the site cache; last layer released) -> FLOW_DONE / KV_ARRIVE
(first token: TTFT) -> decode join at a step boundary -> DECODE_TICK when it completes. Decode
completion times are computed from ``CostModel.decode_span_s`` between batch membership changes,
so events grow with requests, not tokens. Each ``EventKind`` has one handler (the map is checked
complete at construction) and one frozen event type (``events.py``). Pure: no clock reads, no
I/O (the trace reader is called through the workload iterator it is given). The workload comes
in as ``workload.SpecRow`` tuples (``SimRequestSpec``s given are read into them): a frozen
dataclass per request, twice (trace record, then spec), cost as much as routing it.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any, cast

from prfaas.core.ids import RequestId
from prfaas.core.request import TRANSITIONS, InvalidTransition, RequestState
from prfaas.core.views import new_request_view
from prfaas.policy import NoRouteError, PrefillBatcher
from prfaas.policy.batching import PREFILL_LOOKAHEAD
from prfaas.sim.control import ControlLoop
from prfaas.sim.decode import DecodeStage
from prfaas.sim.events import (
    Arrival,
    CacheMove,
    CapacityChange,
    EventKind,
    FlowDone,
    Handoff,
    PrefillDone,
    Timer,
    new_payload,
)
from prfaas.sim.homes import build_homes
from prfaas.sim.metrics import Metrics
from prfaas.sim.nodes import PrefillNode, SimNode
from prfaas.sim.plumbing import GatewayCpu
from prfaas.sim.prefill_work import found_since_routed, service_s
from prfaas.sim.request import SimRequest
from prfaas.sim.scenario import SimScenario
from prfaas.sim.world import World
from prfaas.workload import FixedLengths, LengthDistribution, SimRequestSpec, TruncatedLogNormal
from prfaas.workload.mooncake import trace_rows
from prfaas.workload.requests import SpecRow, row_of, synthetic_rows, trace_request_rows

_ARRIVAL = EventKind.ARRIVAL
_KV_ARRIVE = EventKind.KV_ARRIVE
_PREFILL_DONE = EventKind.PREFILL_DONE
_ROUTED = RequestState.ROUTED
_PREFILLING = RequestState.PREFILLING
_TRANSFERRING = RequestState.TRANSFERRING
_FAILED = RequestState.FAILED
# The states each hot-path move may start from (``core.request.TRANSITIONS``, inverted once): one
# set lookup per move instead of a dict lookup and a set lookup.
_INTO_ROUTED = frozenset(s for s, to in TRANSITIONS.items() if _ROUTED in to)
_INTO_PREFILLING = frozenset(s for s, to in TRANSITIONS.items() if _PREFILLING in to)
_INTO_TRANSFERRING = frozenset(s for s, to in TRANSITIONS.items() if _TRANSFERRING in to)
_request_id = cast(Callable[[str], RequestId], str)
"""``RequestId`` without the ``NewType`` call (a Python-level call per request, ~30 ns): ``str``
of a ``str`` is the object itself."""


def _advance(req: SimRequest, state: RequestState) -> None:
    """``core.request.advance`` for the cold paths (the hot ones inline the same check)."""
    if state not in TRANSITIONS[req.state]:
        raise InvalidTransition(f"r{req.index}", req.state, state)
    req.state = state


class Simulator:
    def __init__(self, scenario: SimScenario, requests: Iterator[SimRequestSpec] | None = None):
        scenario.validate()
        self.world = w = World(scenario)
        self.homes = build_homes(w)
        self.control = ControlLoop(w, self.homes)
        self.decode = DecodeStage(w, self.control.drained, self._retime_prefills)
        self.batcher = PrefillBatcher(scenario.prefill_token_budget)
        # The world's containers are never replaced: held directly (fewer lookups per event).
        self._q = w.q
        self._kv_bytes = w.kv_bytes
        self._links = w.links
        self._decode_by_id = w.decode_by_id
        self._decode_pools = w.pools.decode
        self._prefill_pools = w.pools.prefill
        self._home_sites = tuple(self.homes)
        # Each site's prefix cache, by site number and by site id: the per-request lookup and
        # insert call it directly (``GlobalKVManager.use`` / ``store`` inline: a call saved each).
        self._caches = tuple(w.kv.cache(sid) for sid in w.site_ids)
        self._cache_by_id = dict(zip(w.site_ids, self._caches, strict=True))
        self._lookup_at_start = tuple(
            s.lookup_at_start and scenario.prefix_cache for s in scenario.sites
        )
        # Each home site's gateway CPU (``sim.plumbing``): None when no gateway term is charged.
        self._gateways = tuple(w.gateway_cpu(h) for h in self._home_sites)
        w.pin_gateways(dict(zip(self._home_sites, self._gateways, strict=True)))
        self.gateways: dict[int, GatewayCpu] = {
            h: g for h, g in zip(self._home_sites, self._gateways, strict=True) if g is not None
        }
        """Home site index -> its gateway's CPU (the max-rate probe reads their backlogs)."""
        # The run reads its requests as ``SpecRow`` tuples (no frozen dataclass per request).
        self._requests: Iterator[SpecRow] = (
            map(row_of, requests) if requests is not None else self._workload()
        )
        self.num_events = 0
        self.probes: list[tuple[float, int, Callable[[Simulator], None]]] = []
        """Pending probes, earliest first (``schedule_probe``)."""
        self._primed = False
        self.last_arrival_s = 0.0
        handlers: dict[EventKind, Callable[[Any], None]] = {
            EventKind.CAPACITY: self._on_capacity,
            EventKind.FLOW_DONE: self._on_flow_done,
            EventKind.PREFILL_DONE: self._on_prefill_done,
            EventKind.KV_ARRIVE: self.decode.on_kv_arrive,
            EventKind.DECODE_TICK: self.decode.on_tick,
            EventKind.CONVERT: self.control.on_convert,
            EventKind.ARRIVAL: self._on_arrival,
            EventKind.CONTROL: self.control.on_control,
            EventKind.SAMPLE: self.control.on_sample,
            EventKind.PROBE: self._on_probe,
        }
        missing = [k.name for k in EventKind if k not in handlers]
        if missing:
            raise AssertionError(f"no handler for event kinds {missing}")
        # Indexed by the kind's value (0..n-1): a list lookup in the loop, not a dict's hash.
        self._handlers: tuple[Callable[[Any], None], ...] = tuple(handlers[k] for k in EventKind)

    # -- what drivers read -------------------------------------------------------------------------
    @property
    def sc(self) -> SimScenario:
        return self.world.sc

    @property
    def now(self) -> float:
        return self.world.now

    @property
    def metrics(self) -> Metrics:
        return self.world.metrics

    @property
    def nodes(self) -> list[SimNode]:
        return self.world.nodes

    @property
    def stop(self) -> bool:
        return self.world.stop

    @stop.setter
    def stop(self, value: bool) -> None:
        self.world.stop = value

    @property
    def on_finish(self) -> Callable[[SimRequest], None] | None:
        """Called with each request as it completes (drivers comparing runs request by request)."""
        return self.world.on_finish

    @on_finish.setter
    def on_finish(self, fn: Callable[[SimRequest], None] | None) -> None:
        self.world.on_finish = fn

    def _workload(self) -> Iterator[SpecRow]:
        sc = self.world.sc
        rng = random.Random(sc.seed)
        homes = sum(1 for s in sc.sites if s.kind == "pd")
        if sc.trace is not None:
            records = trace_rows(sc.trace, sc.trace_limit)
            return trace_request_rows(
                records, rate_scale=sc.rate_scale, duration_s=sc.duration_s, num_home_sites=homes,
                max_prompt_tokens=sc.max_prompt_tokens,
            )  # fmt: skip
        lc = sc.lengths
        dist: LengthDistribution
        if lc.kind == "fixed":
            dist = FixedLengths(lc.fixed_tokens)
        else:
            dist = TruncatedLogNormal(lc.mu, lc.sigma, lc.min_tokens, lc.max_tokens)
        if sc.max_prompt_tokens is not None:
            dist = dist.capped(sc.max_prompt_tokens)
        return synthetic_rows(
            sc.arrival, dist, sc.output_tokens, sc.duration_s, rng,
            stratified=sc.stratified, num_home_sites=homes,
        )  # fmt: skip

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, until_s: float | None = None) -> Metrics:
        w = self.world
        horizon = until_s if until_s is not None else w.sc.duration_s + w.sc.drain_s
        if not self._primed:
            self._primed = True
            self._next_arrival()
        handlers = self._handlers
        n = 0
        heap = w.q.heap
        pop = heapq.heappop
        while heap and heap[0][0] <= horizon and not w.stop:
            event = pop(heap)
            w.now = event[0]
            handlers[event[1]](event)
            n += 1
        self.num_events += n
        return w.metrics

    @property
    def done(self) -> bool:
        return self.world.stop or (self._primed and not len(self.world.q))

    @property
    def arrivals_done(self) -> bool:
        return self.world.arrivals_done

    def _next_arrival(self) -> None:
        w = self.world
        row = next(self._requests, None)
        if row is None:
            self.last_arrival_s = w.now
            w.arrivals_done = True
            return
        index, arrival_s, num_prompt, num_output, hashes, home = row
        homes = self._home_sites
        k = home % len(homes)
        req = SimRequest(index, arrival_s, num_prompt, num_output, hashes, homes[k])
        q = self._q
        # Routed once its gateway has handled it (arrivals come in order: a FIFO, no event).
        gateway = self._gateways[k]
        at_s = arrival_s if gateway is None else gateway.route_at(arrival_s, num_output)
        heapq.heappush(q.heap, (at_s, _ARRIVAL, next(q.seq), req))

    # -- arrival and routing -----------------------------------------------------------------------
    def _on_arrival(self, event: Arrival) -> None:
        self._next_arrival()
        req = event[3]
        w = self.world
        m = w.metrics
        m.num_arrived += 1
        m.last_arrival_s = w.now
        sc = w.sc
        home = self.homes[req.home]
        hashes = req.block_hashes if sc.prefix_cache else ()
        cached = w.kv.peek(hashes, req.num_prompt) if hashes else {}
        view = new_request_view(
            _request_id(f"r{req.index}"), req.num_prompt, cached, hashes, req.num_output
        )
        try:
            d = home.router.route(view, home.view, w.now)
        except NoRouteError:
            _advance(req, _FAILED)
            m.num_failed += 1
            return
        site = w.site_index[d.prefill_site]
        node = w.prefill_by_id[d.prefill_node]  # routers pick prefill pools
        # The decode node, now (as the live gateway does): reserved until the KV arrives.
        placed = home.choose_decode()  # placement.choose(view, home site, now), resolved once
        if placed is None:  # the live gateway answers 503: the request fails
            _advance(req, _FAILED)
            m.num_failed += 1
            return
        dec = self._decode_by_id[placed]  # a decode pool's member
        if req.state not in _INTO_ROUTED:  # _advance, inline (hot path)
            raise InvalidTransition(f"r{req.index}", req.state, _ROUTED)
        req.state = _ROUTED
        dec.reserved += 1
        self._decode_pools[req.home].touch(dec)
        req.decode_node = placed
        req.cached_home = cached.get(w.site_ids[req.home], 0)
        req.offloaded = d.offloaded
        req.rerouted = d.rerouted
        if d.offloaded:
            m.num_offloaded += 1
        if d.rerouted:
            m.num_rerouted += 1
        move = d.cache_move
        if move is not None and move.num_tokens > 0:
            src, dst = w.site_index[move.src_site], w.site_index[move.dst_site]
            link = w.links.get((src, dst))
            if link is not None and link.capacity > 0:
                m.num_cache_moves += 1
                req.num_cached = d.num_cached_tokens
                nbytes = w.kv_bytes.total(move.num_tokens)
                kvb = w.kv_bytes
                link.add(w.now, nbytes, 0.0, CacheMove(req, node, dst), kvb.num_layers)
                if home.observe is not None:
                    home.observe(req.num_prompt - req.num_cached, req.num_output, w.now)
                return
        # What the prefill site really reuses (refreshes its LRU, counts its hit rate); no cache
        # changed since the peek, so its figure for that site holds.
        peeked = cached.get(d.prefill_site, 0)
        if hashes:  # GlobalKVManager.use, inline (hot path)
            used = self._cache_by_id[d.prefill_site].lookup(hashes, req.num_prompt, peeked)
        else:
            used = w.kv.use(d.prefill_site, hashes, req.num_prompt, peeked)
        req.num_cached = min(d.num_cached_tokens, used)
        if home.observe is not None:
            home.observe(req.num_prompt - req.num_cached, req.num_output, w.now)
        self._assign(req, node, site)

    def _assign(self, req: SimRequest, node: PrefillNode, site: int) -> None:
        w = self.world
        uncached = req.num_prompt - req.num_cached
        svc = req.work_s = service_s(req, node)
        now = w.now
        node.free_at_s = (node.free_at_s if node.free_at_s > now else now) + svc
        node.queue.append(req)
        node.queued_tokens += uncached
        w.site_queued[site] += 1
        if w.site_queued[site] > w.peak_queued[site]:
            w.peak_queued[site] = w.site_queued[site]
        self._prefill_pools[site].touch(node)
        if not node.busy:
            self._start_batch(node)

    # -- prefill ----------------------------------------------------------------------------------
    def _start_batch(self, node: PrefillNode, continuing: bool = False) -> None:
        """Start ``node``'s next batch (``continuing``: right after its last one, so it was
        busy all along)."""
        w = self.world
        queue = node.queue
        if len(queue) == 1:  # the batcher's rule for a lone request: it goes, alone
            batch = [queue.popleft()]
            tokens = batch[0].num_prompt - batch[0].num_cached
        else:
            # Lazily: the batcher reads as far as the batch goes (on the Mooncake case 5 of the
            # 30 requests a list of the lookahead computed; on the paper's, 1.4 of 10).
            ahead = itertools.islice(queue, PREFILL_LOOKAHEAD)
            batch_plan = self.batcher.next_batch(r.num_prompt - r.num_cached for r in ahead)
            batch = [queue.popleft() for _ in range(batch_plan.num_requests)]
            tokens = batch_plan.num_tokens
        node.queued_tokens -= tokens  # as _assign counted them
        if self._lookup_at_start[node.site]:
            tokens -= found_since_routed(batch, node, self._caches[node.site])
        node.cached_load = None
        w.site_queued[node.site] -= len(batch)
        now = w.now
        node.busy = True
        start = self._start_transfer
        if len(batch) == 1:  # most batches (no loop: hot path)
            work = batch[0].work_s
        else:
            work = 0.0
            for req in batch:
                work += req.work_s
            if node.step_fixed_s:  # paid once by the batch (CostModel.batched_prefill_s)
                work = node.cm.batched_prefill_s([req.work_s for req in batch])
        shared = w.shared[node.site]
        if shared is None:
            factor = 1.0
        else:
            if shared.mixed_steps:  # the decode's steps now carry this batch's chunks
                shared.chunk_s = work / self.batcher.steps(tokens)
            if not continuing:  # the site's shared cores get busier
                shared.busy += 1
            if not continuing or shared.mixed_steps:
                self.decode.respan_site(node.site, now, node)
            factor = shared.prefill_slowdown()
        duration = work * factor
        if len(batch) == 1:
            handoffs: tuple[Handoff, ...] = (start(batch[0], node, duration, now),)
        else:
            handoffs = tuple([start(req, node, duration, now) for req in batch])
        node.busy_s += duration
        node.batch = handoffs
        node.batch_end_s = now + duration
        if shared is not None:
            node.shares_cores(work, factor, now, not any(h[0].transfer_bytes for h in handoffs))
        q = self._q
        heapq.heappush(
            q.heap,
            (now + duration, _PREFILL_DONE, next(q.seq), node, handoffs),
        )

    def _start_transfer(
        self, req: SimRequest, node: PrefillNode, duration: float, now: float
    ) -> Handoff:
        if req.state not in _INTO_PREFILLING:  # _advance, inline (hot path)
            raise InvalidTransition(f"r{req.index}", req.state, _PREFILLING)
        req.state = _PREFILLING
        req.prefill_start_s = now
        home = req.home
        req.prefill_node = node.node_id
        # Chosen and reserved at routing time (``_on_arrival``).
        handoff = new_payload(Handoff, (req, self._decode_by_id[req.decode_node]))
        kvb = self._kv_bytes
        n = req.num_prompt + req.num_output
        # KvBytes.total, without the call when no layer has a sliding window (hot path).
        req.kv_bytes = kvb.fixed_bytes + n * kvb.per_token_bytes if kvb.linear else kvb.total(n)
        if node.site == home:
            req.transfer_bytes = 0
            return handoff
        nbytes = kvb.to_send(req.num_prompt, req.cached_home)
        req.transfer_bytes = nbytes
        link = self._links[(node.site, home)]
        req.flow = link.add(now, nbytes, duration, handoff, kvb.num_layers)
        return handoff

    def _retime_prefills(self, site: int, now: float, changed: SimNode | None) -> None:
        """Site ``site``'s shared cores got busier or freer at ``now``: every other batch
        computing there goes on at the new speed (processor sharing), its end moved (a new
        PREFILL_DONE; the old one is then stale). A batch whose KV crosses to another site keeps
        the speed it started with: its link flow was paced by it (``_start_transfer``)."""
        shared = self.world.shared[site]
        assert shared is not None
        factor = shared.prefill_slowdown()
        q = self._q
        for node in self.world.prefill_nodes_of(site):
            if node is changed or not node.busy or not node.batch_retimable:
                continue
            if factor != node.batch_factor:
                end = node.retime(now, factor)
                heapq.heappush(q.heap, (end, _PREFILL_DONE, next(q.seq), node, node.batch))

    def _on_prefill_done(self, event: PrefillDone) -> None:
        w = self.world
        end_s, _, _, node, batch = event
        if batch is not node.batch or end_s != node.batch_end_s:
            return  # re-timed since (``_retime_prefills``): a later event ends it
        now = w.now
        node.busy = False
        node.cached_load = None
        site = node.site
        cache = self._caches[site]
        sc = w.sc
        local_rate = sc.local_fabric_gbps * 1e9 / 8
        kvb = self._kv_bytes
        linear = kvb.linear
        heap = self._q.heap
        seq = self._q.seq
        for handoff in batch:
            req = handoff[0]  # handoff.req, without the field descriptor (hot path)
            if req.state not in _INTO_TRANSFERRING:  # _advance, inline (hot path)
                raise InvalidTransition(f"r{req.index}", req.state, _TRANSFERRING)
            req.state = _TRANSFERRING
            req.prefill_end_s = now
            w.site_prefilled[site] += 1
            if req.block_hashes and sc.prefix_cache:  # GlobalKVManager.store, inline
                cache.insert(req.block_hashes, req.num_prompt)
            if req.transfer_bytes:
                flow = req.flow
                if flow is not None:
                    flow.link.produced(flow, now)
            else:
                n = req.num_prompt
                total = kvb.fixed_bytes + n * kvb.per_token_bytes if linear else kvb.total(n)
                last_layer = total / kvb.num_layers
                at_s = now + last_layer / local_rate
                heapq.heappush(heap, (at_s, _KV_ARRIVE, next(seq), req, handoff[1]))
        if node.queue:
            self._start_batch(node, True)
            return
        shared = w.shared[site]
        if shared is not None:  # the node stops computing: its site's shared cores get freer
            shared.busy -= 1
            self.decode.respan_site(site, now, node)
        if node.draining:
            self.control.drained(node)

    # -- links ------------------------------------------------------------------------------------
    def _on_flow_done(self, event: FlowDone) -> None:
        _, _, _, flow, version = event
        if flow.version != version or flow.finished:
            return
        w = self.world
        link = flow.link
        link.finish(flow, w.now)
        payload = flow.payload
        if isinstance(payload, Handoff):
            req, dec = payload
            req.flow = None
            delay = link.rtt_s / 2
            if delay > 0:
                q = self._q
                heapq.heappush(q.heap, (w.now + delay, _KV_ARRIVE, next(q.seq), req, dec))
            else:
                self.decode.on_kv_arrive(payload)
            return
        assert isinstance(payload, CacheMove), payload
        req, node, dst = payload
        dst_id = w.site_ids[dst]
        w.kv.store(dst_id, req.block_hashes, req.num_cached + 1)
        req.num_cached = min(req.num_cached, w.kv.use(dst_id, req.block_hashes, req.num_prompt))
        self._assign(req, node, dst)

    def _on_capacity(self, event: CapacityChange) -> None:
        w = self.world
        _, _, _, a, b, gbps = event
        for key in ((a, b), (b, a)):
            w.links[key].set_capacity(w.now, gbps * 1e9 / 8)

    def schedule_probe(self, at_s: float, fn: Callable[[Simulator], None]) -> None:
        """Call ``fn(self)`` at ``at_s`` (after everything else due then); ``--find-max-rate``
        probes twice (halfway and at the end)."""
        heapq.heappush(self.probes, (at_s, self.world.q.next_seq(), fn))
        self.world.q.timer(at_s, EventKind.PROBE)

    def _on_probe(self, _: Timer) -> None:
        if self.probes:
            heapq.heappop(self.probes)[2](self)
