"""``PoolSimulator``: one PrfaaS pool shared by several tenants, each with its own PD prefill
nodes, link, model, arrivals and threshold tuner; admission, queueing and fair share are
``policy.PoolAdmission``, the object the live front door runs, and each tenant's threshold is
``policy.choose_threshold`` over the pool's ``PoolFeedback``.

What it models (``docs/pool.md``): per tenant, arrivals and prompt lengths (all uncached at
home: the tenant's own prefix cache is not modelled), its router: the tenant file's
(``policy.make_router``, the live gateway's object and arguments) over the tenant's view
(``sim/pool_view.py``: its local nodes, the pool as one PrfaaS prefill node, its link to the pool
from the egress fluid), wrapped as live by
``policy.route_pool_tenant`` (keeps for the link counted; for coordinated tenants, a request kept
local when the pool's expected queueing is over its TTFT target and the local queue is shorter;
``threshold`` offloads when the length is over the tenant's ``t``), a refused submit prefilled
locally, local prefill nodes (FIFO, the tenant's profile); at the pool, each group's nodes (the
group's profile) and the egress fluid (``sim/pool_egress.py``). TTFT ends when the prefill is
done locally, or when the last KV byte has reached the tenant (plus the link's RTT: the submit's
and the KV's one-way delays).
Front door outages (``PoolSimScenario.front_door_outages``) lose its queue and change its epoch;
each tenant's ``policy.PoolSession`` sends what it had pending local; a lost pool node
(``pool_node_failures``) fails its prefill to the tenant, which prefills it locally. Decode is
not modelled.

The pool's prefix stores, as live (``sim/pool_prefixes.py``: the live node's store's code, its
namespaces and quotas): a prefill is placed by ``policy.pool_placement.dispatch_cached``, the
live front door's placement, on the free node holding the longest prefix of its prompt for its
tenant, charged what that node computes, and its node runs that long; it ends by
``policy.pool_placement.settle_cached``, the live door's end, which trues the charge up when the
node found other than its placement expected: never here (the hints are the stores themselves,
read at the same instant as the node's own lookup), so a zero correction.

The profiles' plumbing terms (``perf.plumbing``), each charged to the process that pays it, from
that process's profile, as ``sim/plumbing.py`` does in the single-deployment simulator, and
switched off as there (a scenario's ``plumbing_off``: the tenant file's ``simulation.plumbing``
for a tenant's processes, the pool file's for a group's nodes): a pool node's
``prefill_per_request_s``, ``prefill_per_token_s`` and ``prefill_in_service_excess`` (its group's
profile) are in each pool prefill's node-seconds
(``policy.pool_admission.prefill_node_s``, which the live front door prices with too, so the
admission's fair share and expected start count them); a tenant's local prefill node's (its PD
site's profile) are added to each local prefill's service time (the tenant's router still reads
the forward pass alone, as a live router does); each tenant's gateway is a ``GatewayCpu``
(``gateway_per_request_s``) that routes its arrivals in order, each after the routing ahead of
it. ``gateway_per_output_token_s`` is booked per output token, and the pool simulator has no
output tokens: it changes nothing here (in neither simulator does the relay hold a routing back).
The decode terms (``decode_per_request_s``, ``decode_per_kv_byte_s``, ``decode_per_step_s``,
``decode_per_output_token_s``, both ``first_token_wait`` terms) are not charged: no decode
is modelled, and TTFT ends when the KV
has arrived (a decode node's install would add ``decode_per_request_s`` and
``decode_per_kv_byte_s`` x the KV bytes after that). ``shared_core_overhead`` is not charged:
every simulated node has its own core. All of it is extra time in existing events, never an
event of its own. Events are ``(time_s, priority, seq, kind, payload)`` on one heap; the same seeds
give the same run. Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import random
from collections import deque
from types import MappingProxyType
from typing import Any

from prfaas.core.ids import RequestId, SiteId
from prfaas.core.views import new_request_view
from prfaas.policy.pool_admission import (
    Accepted,
    EgressState,
    PoolAdmission,
    PrefillJob,
    prefill_node_s,
)
from prfaas.policy.pool_coordination import NOTHING_SAID, PoolSaid
from prfaas.policy.pool_placement import dispatch_cached, settle_cached
from prfaas.policy.pool_session import Fallback, PoolSession
from prfaas.policy.pool_tenant_route import (
    KEPT_FOR_LINK,
    KEPT_FOR_QUEUEING,
    POOL_SITE,
    GateReading,
    route_pool_tenant,
)
from prfaas.policy.router import make_router
from prfaas.policy.window import LengthWindow
from prfaas.sim.kv_bytes import KvBytes
from prfaas.sim.plumbing import GatewayCpu, charged_cost_model
from prfaas.sim.pool_egress import EgressFlow, PoolEgress
from prfaas.sim.pool_prefixes import PoolPrefixes
from prfaas.sim.pool_scenario import PoolSimScenario
from prfaas.sim.pool_tenant_run import PoolRequest, TenantRun
from prfaas.sim.pool_tuning import first_sample, tenant_threshold
from prfaas.sim.pool_view import PoolTenantView
from prfaas.workload import arrival_times

_DONE, _ARRIVAL, _TUNE, _BEAT = 0, 1, 2, 3  # priorities at equal times: completions first
_TIMERS = (_TUNE, _BEAT)  # periodic: they keep nothing alive
_NO_CACHE: MappingProxyType[SiteId, int] = MappingProxyType({})  # the tenant's home cache: none


class PoolSimulator:
    def __init__(self, sc: PoolSimScenario) -> None:
        self.sc = sc
        self.admission = PoolAdmission(sc.shape)
        self.now = 0.0
        self.num_events = 0
        self._heap: list[tuple[float, int, int, int, Any]] = []
        self._seq = itertools.count()
        self._window = (sc.measure_from_s, sc.window_end_s)
        self.egress = PoolEgress(
            sc.shape.egress_bytes_per_s,
            {t.name: t.weight for t in sc.shape.tenants},
            {t.name: t.link_bytes_per_s for t in sc.tenants},
            self._window,
        )
        # Each group's free nodes, in name order (ties in placement go to the first, as live).
        # Which store each node has, and what it holds: ``self.prefixes``.
        self._free = {g.name: sorted(g.nodes) for g in sc.groups}
        self._node_order = {name: {n: i for i, n in enumerate(f)} for name, f in self._free.items()}
        self._egress_wake = math.inf
        self._pending: dict[tuple[str, str], PoolRequest] = {}
        self._running: dict[str, dict[tuple[str, str], Any]] = {g.name: {} for g in sc.groups}
        self.epoch = 1
        self._door_up = True
        self._num_live = 0
        self._kv = {g.model: KvBytes(g.cost.model.cache).total for g in sc.groups}
        # What the pool's nodes run on (the terms switched off zeroed): a prefill's price.
        self._node_cost = {g.model: charged_cost_model(g.cost, g.plumbing_off) for g in sc.groups}
        self.prefixes = PoolPrefixes(sc, self._kv, self._node_cost, self._pending)
        """Each node process's prefix store, and the placement's hints from them."""
        self.tenants: dict[str, TenantRun] = {}
        for t in sc.tenants:
            run = TenantRun(
                spec=t,
                rng=random.Random(t.seed),
                local_free=t.num_local_prefill,
                window=LengthWindow(sc.window_size),
            )
            p = charged_cost_model(t.local_cost, t.plumbing_off).plumbing
            run.local_plumbing = p
            if p.gateway_per_request_s > 0 or p.gateway_per_output_token_s > 0:
                run.gateway = GatewayCpu(p.gateway_per_request_s, p.gateway_per_output_token_s)
            stop = sc.duration_s if t.stop_s is None else min(t.stop_s, sc.duration_s)
            if t.trace is not None:
                run.arrivals = (t.start_s + a for a, _ in t.trace if t.start_s + a <= stop)
                run.trace_lengths = deque(n for _, n in t.trace)
                if t.trace_block_hashes:
                    run.trace_hashes = deque(t.trace_block_hashes)
            else:
                span = max(0.0, stop - t.start_s)
                run.arrivals = (t.start_s + a for a in arrival_times(t.arrival, span, run.rng))
            run.compute_s_in_window = {g.name: 0.0 for g in sc.groups}
            self._routing(run)
            run.threshold_tokens = self._first_threshold(run)
            self.tenants[t.name] = run
            self._next_arrival(run)
            if t.tuner != "fixed":
                self._push(sc.tune_interval_s, _TUNE, t.name)
            run.session = PoolSession(sc.silence_s)
            run.session.heard(self.epoch, 0.0)
            if sc.front_door_outages:
                self._push(sc.heartbeat_interval_s, _BEAT, t.name)
        for at_s, down_s in sc.front_door_outages:
            self._push(at_s, _DONE, lambda d=down_s: self._door_dies(d))
        for at_s, group, down_s in sc.pool_node_failures:
            self._push(at_s, _DONE, lambda g=group, d=down_s: self._node_lost(g, d))

    def _routing(self, run: TenantRun) -> None:
        """The tenant's router as the live gateway builds it (its file's ``policy.router``, the
        pool as its one PrfaaS site, its cost models), its view, and its gate."""
        spec = run.spec
        home = SiteId(spec.home_site)
        run.router = make_router(
            spec.router, home, (SiteId(POOL_SITE),),
            remote=spec.router_remote, local=spec.router_local,
        )  # fmt: skip
        run.view = PoolTenantView(run, self.egress, self)
        if spec.tuner == "coordinated":
            run.gate = functools.partial(self._gate_reading, run)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        horizon = self.sc.duration_s + self.sc.drain_s
        while self._heap:
            t, _, _, kind, payload = heapq.heappop(self._heap)
            if t > horizon:
                break
            self.num_events += 1
            if kind not in _TIMERS:
                self._num_live -= 1
            self.now = t
            self.egress.advance(t)
            if kind == _DONE:
                payload()
            elif kind == _ARRIVAL:
                self._on_arrival(self.tenants[payload[0]], payload[1])
            elif kind == _TUNE:
                self._on_tune(self.tenants[payload])
            elif kind == _BEAT:
                self._on_beat(self.tenants[payload])
            self._settle_egress()
            if self._idle():
                break
        self.egress.advance(self.now)

    def _idle(self) -> bool:
        # Only tuner ticks left: nothing will happen any more.
        return self._num_live == 0 and not self.egress.flows and not self._pending

    def _push(self, t: float, kind: int, payload: Any) -> None:
        if kind not in _TIMERS:
            self._num_live += 1
        heapq.heappush(self._heap, (t, kind, next(self._seq), kind, payload))

    # -- arrivals and routing ------------------------------------------------------------------
    def _next_arrival(self, run: TenantRun) -> None:
        nxt = next(run.arrivals, None)
        if nxt is not None:
            # Routed once its gateway has handled it (in order: a FIFO, no event of its own).
            gw = run.gateway
            at_s = nxt if gw is None else gw.route_at(nxt, 0)  # no output tokens modelled
            self._push(at_s, _ARRIVAL, (run.spec.name, nxt))

    def _on_arrival(self, run: TenantRun, arrival_s: float) -> None:
        spec = run.spec
        n = (
            run.trace_lengths.popleft()
            if run.trace_lengths is not None
            else (spec.lengths.draw(run.rng))
        )
        run.num_arrived += 1
        req = PoolRequest(spec.name, f"{spec.name}-{run.num_arrived}", arrival_s, n)
        if run.trace_hashes is not None:
            req.block_hashes = run.trace_hashes.popleft()
        run.window.observe(n, 1, self.now)
        self._next_arrival(run)
        if self._routes_to_pool(run, req):
            if not self._door_up:
                run.session.unreachable(req.request_id)
                req.fell_back = True
                self._local(run, req)
                return
            self._fall_back(run, run.session.heard(self.epoch, self.now))
            group = self.sc.group_for(spec.model)
            job = PrefillJob(
                spec.name,
                req.request_id,
                spec.model,
                n,
                prefill_node_s(self._node_cost[spec.model], n),
                self._kv[spec.model](n),
            )
            decision = self.admission.submit(job, self.now)
            if isinstance(decision, Accepted):
                req.offloaded = True
                run.num_offloaded += 1
                run.pool_in_flight += 1
                run.pool_in_flight_tokens += n
                self._pending[(spec.name, req.request_id)] = req
                run.session.submitted(req.request_id, self.now)
                self._dispatch(group.name)
                return
            run.refused[decision.reason] = run.refused.get(decision.reason, 0) + 1
            run.session.refused(req.request_id, decision.reason)
        self._local(run, req)

    def _routes_to_pool(self, run: TenantRun, req: PoolRequest) -> bool:
        """Whether the tenant's router offloads ``req``: the file's router over the tenant's
        view, then, coordinated, the gate (``policy.route_pool_tenant``, the live tenant
        router's decision too); its keeps counted by reason."""
        assert run.router is not None and run.view is not None
        spec = run.spec
        request = new_request_view(RequestId(req.request_id), req.num_tokens, _NO_CACHE, (), 1)
        route = route_pool_tenant(
            run.router, request, run.view, self.now, run.view.home,
            spec.ttft_target_s if run.gate is not None else None, run.gate,
        )  # fmt: skip
        if route.kept == KEPT_FOR_QUEUEING:
            run.num_kept_local_by_feedback += 1
        elif route.kept == KEPT_FOR_LINK:
            run.num_kept_local_for_link += 1
        return route.decision.offloaded

    def _gate_reading(self, run: TenantRun) -> GateReading:
        # The pool's expected queueing for the tenant at this instant (live: the latest
        # feedback), and its own local backlog (each queued or running request's T_local).
        fb = self.admission.feedback(run.spec.name, self.now)
        return GateReading(fb.expected_queueing_s, run.local_work_s, run.spec.num_local_prefill)

    # -- local prefill -------------------------------------------------------------------------
    def _local(self, run: TenantRun, req: PoolRequest) -> None:
        run.num_local += 1
        run.local_work_s += run.spec.local_cost.prefill_s(req.num_tokens)
        run.local_queue.append(req)
        self._start_local(run)

    def _start_local(self, run: TenantRun) -> None:
        while run.local_free > 0 and run.local_queue:
            req = run.local_queue.popleft()
            run.local_free -= 1
            work = run.spec.local_cost.prefill_s(req.num_tokens)  # what _local counted
            dur = work + run.local_plumbing.prefill_overhead_s(req.num_tokens, work)
            self._push(
                self.now + dur, _DONE, lambda r=run, q=req, w=work: self._local_done(r, q, w)
            )

    def _local_done(self, run: TenantRun, req: PoolRequest, work_s: float) -> None:
        run.local_free += 1
        run.local_work_s = max(0.0, run.local_work_s - work_s)
        self._finish(run, req, self.now)
        self._start_local(run)

    # -- the pool ------------------------------------------------------------------------------
    def _egress_state(self) -> EgressState:
        total, per = self.egress.backlog()
        return EgressState(
            pool_backlog_bytes=total,
            tenant_backlog_bytes=tuple(per.items()),
            tenant_link_bytes_per_s=tuple(self.egress.links.items()),
        )

    def _dispatch(self, group: str) -> None:
        free = self._free[group]
        while self._door_up and free:
            # The live front door's placement: the admission's pick, on the free node holding
            # the longest prefix of its prompt for its tenant, charged what that node computes.
            placed = dispatch_cached(
                self.admission, group, free, self.now, self._egress_state(), self.prefixes
            )
            if placed is None:
                return
            job, node = placed.job, placed.pick.node
            free.remove(node)
            run = self.tenants[job.tenant]
            req = self._pending.pop((job.tenant, job.request_id))
            # The node's own lookup (refreshes its LRU): what the hint read, at this instant.
            store, cached = self.prefixes.looked_up(group, node, job.tenant, req)
            req.pool_store, req.pool_cached_tokens = store, cached
            run.pool_hit_tokens += cached
            run.pool_lookup_tokens += req.num_tokens
            end = self.now + self.prefixes.compute_s(job, cached)
            lo, hi = self._window
            run.compute_s_in_window[group] += max(0.0, min(end, hi) - max(self.now, lo))
            run.session.started(job.request_id)
            self.egress.add(EgressFlow(job.tenant, req, float(job.kv_bytes), self.now, end))
            adm = self.admission  # the epoch that placed it is the one to tell
            flow = self.egress.flows[-1]
            ran = (job, end, adm, flow, node, placed, cached)
            self._running[group][(job.tenant, job.request_id)] = ran
            self._push(end, _DONE, lambda j=job, g=group, a=adm: self._pool_done(j, g, a))

    def _release(self, group: str, node: str) -> None:
        """``node`` is free again (its place in the name order kept)."""
        free = self._free[group]
        free.append(node)
        free.sort(key=self._node_order[group].__getitem__)

    def _pool_done(self, job: PrefillJob, group: str, admission: PoolAdmission) -> None:
        ran = self._running[group].pop((job.tenant, job.request_id), None)
        if ran is None:
            return  # its node was lost mid-prefill (``_node_lost``)
        placed, found = ran[5], ran[6]
        # The live door's end: the charge trued up to what the node found (exact hints: 0).
        settle_cached(admission, job, self.now, placed, found, self.prefixes)
        self._release(group, ran[4])
        self.egress.changed()
        self._dispatch_all()

    def _dispatch_all(self) -> None:
        for g in self.sc.groups:
            self._dispatch(g.name)

    def _settle_egress(self) -> None:
        finished = self.egress.take_finished()
        for f in finished:
            req = f.key
            assert isinstance(req, PoolRequest)
            run = self.tenants[req.tenant]
            if req.block_hashes and req.pool_store is not None:  # its checkpoints, if any
                group = self.sc.group_for(run.spec.model).name
                self.prefixes.stored(group, req.pool_store, req.tenant, req, req.pool_cached_tokens)
            self._left_pool(run, req)
            self._finish(run, req, self.now + run.spec.rtt_s)
        if finished:
            self._dispatch_all()  # the egress has room again
        wake = self.egress.next_finish_s()
        if wake < math.inf and wake != self._egress_wake:
            self._egress_wake = wake
            self._push(wake, _DONE, self._noop)

    def _left_pool(self, run: TenantRun, req: PoolRequest) -> None:
        """An offload no longer at the pool (its KV arrived, or it fell back home)."""
        run.pool_in_flight -= 1
        run.pool_in_flight_tokens -= req.num_tokens

    def _noop(self) -> None:
        self._egress_wake = math.inf

    def _finish(self, run: TenantRun, req: PoolRequest, at_s: float) -> None:
        req.ttft_s = at_s - req.arrival_s
        run.num_completed += 1
        if self._window[0] <= req.arrival_s <= self._window[1]:
            run.ttft_s.append(req.ttft_s)
        if req.fell_back:
            run.fallback_ttft_s.append(req.ttft_s)

    # -- front door failures (issue 21, item 7) --------------------------------------------------
    def _door_dies(self, down_s: float) -> None:
        self._door_up = False
        for name in self.tenants:  # its queue is gone; started prefills stream on from the nodes
            self.admission.withdraw(name, self.now)
        self._push(self.now + down_s, _DONE, self._door_back)

    def _door_back(self) -> None:
        self.epoch += 1
        self.admission = PoolAdmission(self.sc.shape)
        self._door_up = True

    def _node_lost(self, group: str, down_s: float) -> None:
        running = self._running[group]
        free = self._free[group]
        if running:  # the oldest running prefill fails with its node, and its KV stream
            key = next(iter(running))
            job, end, admission, flow, node, _, _ = running.pop(key)
            admission.finish(job, self.now)
            run = self.tenants[job.tenant]
            lo, hi = self._window
            run.compute_s_in_window[group] -= max(0.0, min(end, hi) - max(self.now, lo))
            self.egress.flows.remove(flow)
            self.egress.changed()
            req = flow.key
            assert isinstance(req, PoolRequest)
            run.session.failed(req.request_id, "node_lost")
            self._left_pool(run, req)
            req.fell_back = True
            self._local(run, req)
        elif free:
            node = free.pop()  # an idle node is lost (the last by name)
        else:
            return  # every node is down already
        self.prefixes.node_lost(group, node)
        self._push(self.now + down_s, _DONE, lambda: self._node_back(group, node))

    def _node_back(self, group: str, node: str) -> None:
        self._release(group, node)
        self._dispatch(group)

    def _on_beat(self, run: TenantRun) -> None:
        if self._door_up:
            self._fall_back(run, run.session.heard(self.epoch, self.now))
        else:
            self._fall_back(run, run.session.tick(self.now))
        if not self._idle():
            self._push(self.now + self.sc.heartbeat_interval_s, _BEAT, run.spec.name)

    def _fall_back(self, run: TenantRun, fallbacks: tuple[Fallback, ...]) -> None:
        for fb in fallbacks:
            req = self._pending.pop((run.spec.name, fb.request_id), None)
            if req is not None:
                self._left_pool(run, req)
                req.fell_back = True
                self._local(run, req)

    # -- tuning --------------------------------------------------------------------------------
    def _first_threshold(self, run: TenantRun) -> int:
        if run.spec.threshold_tokens is not None:
            return run.spec.threshold_tokens
        lengths, rate, share = first_sample(run.spec, self.sc)
        return self._choose(run, lengths, rate, PoolSaid(share))

    def _choose(self, run: TenantRun, lengths: tuple[int, ...], rate: float, said: PoolSaid) -> int:
        kv = self._kv[run.spec.model]
        return tenant_threshold(run.spec, self.sc, kv, lengths, rate, said, run.local_work_s)

    def _on_tune(self, run: TenantRun) -> None:
        spec = run.spec
        self._push(self.now + self.sc.tune_interval_s, _TUNE, spec.name)
        if len(run.window) < self.sc.tune_min_samples:
            return
        said = NOTHING_SAID  # uncoordinated: as if it owned the pool
        if spec.tuner == "coordinated":
            said = PoolSaid.of(self.admission.feedback(spec.name, self.now, self._egress_state()))
        lengths = tuple(run.window.prompt_lengths())
        t = self._choose(run, lengths, run.window.rate_rps(), said)
        if t != run.threshold_tokens:
            run.threshold_tokens = t
            run.threshold_updates.append((self.now, t))
