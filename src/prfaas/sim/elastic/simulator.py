"""``ElasticSim``: a discrete-event model of an elastic PrfaaS pool behind one admission queue.

What it models (assumptions stated in docs/elastic.md): prompts longer than the threshold are
offered to the pool; the pool's nodes pull them from one FIFO queue and prefill them (the cost
model of their hardware), the KV streams over one shared link (FIFO, layer-wise: it ends no
sooner than one layer after the prefill); TTFT ends when the last byte lands. A long prompt the
pool cannot serve in time goes local (the PD site's prefill nodes, which also take every short
prompt): at arrival, the pool is used when its expected TTFT meets the SLO or beats the local
one; with only starting nodes, the waiting room's rule (``policy.autoscaler.wait_for_starting``).
Decode is not modelled (TTFT only); no prefix reuse (every prompt token is uncached).

Nodes start (``startup_s``: charged, serving nothing, counted by the autoscaler as capacity on
its way), serve, drain (finish what they hold, then go) and end. Spot nodes get notices from a
rate (mean time to preemption per node) or a replayed availability trace: a noticed node stops
taking prefills, finishes the one it holds if it (and its KV stream) ends before the deadline,
and hands it back to the head of the queue otherwise; it is gone at the deadline. Adds go to a
spot group when spot is available, else to an on-demand group (SkyServe's fallback, counted).
The ``policy.Autoscaler`` is asked every ``tick_s``: the object the live provider drives.
Pure: no clock, no I/O; randomness from a seeded ``random.Random``.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import random
from collections import deque
from collections.abc import Iterable
from typing import Any

from prfaas.analytic.prices import ASSUMED_USD_PER_GPU_HOUR
from prfaas.core.ids import LinkId
from prfaas.core.views import LinkState
from prfaas.perf import cost_model_for_hardware
from prfaas.policy.autoscaler import (
    Autoscaler,
    GroupObservation,
    ScaleAction,
    wait_for_starting,
)
from prfaas.policy.offered_rate import OfferedRate
from prfaas.policy.pool_actions import GroupKind, PoolNodeView, group_for_add, node_to_drain
from prfaas.policy.waiting_room import WaitingRoom, WaitVerdict
from prfaas.sim.elastic.bound import pool_bound
from prfaas.sim.elastic.config import ElasticScenario, GroupConfig
from prfaas.sim.elastic.load import Arrival
from prfaas.sim.elastic.pool import Job, NodeState, PoolNode, group_hours
from prfaas.sim.elastic.report import ElasticReport, Sample, ScaleEvent, percentile

_ARRIVE, _READY, _DONE, _NOTICE, _GONE, _TICK, _AVAIL = range(7)
GPUS_PER_NODE = 8


class ElasticSim:
    def __init__(self, sc: ElasticScenario, arrivals: Iterable[Arrival], duration_s: float):
        sc.validate()
        self.sc = sc
        self.duration_s = duration_s
        self.rng = random.Random(sc.seed)
        cm = self.cm = cost_model_for_hardware(sc.model, sc.groups[0].hardware)
        local_cm = self.local_cm = cost_model_for_hardware(sc.model, sc.local_hardware)
        # Memoised per length (bounded): the profiles interpolate on every call.
        self._prefill_s = functools.lru_cache(maxsize=1 << 16)(lambda n: cm.prefill_s(n, 0))
        self._local_prefill_s = functools.lru_cache(maxsize=1 << 16)(
            lambda n: local_cm.prefill_s(n, 0)
        )
        self._kv_per_token = cm.kv_bytes(100_000) / 100_000
        self.autoscaler = Autoscaler(sc.autoscale) if sc.autoscale is not None else None
        self.room = WaitingRoom(max_wait_s=max(sc.ttft_slo_s, 600.0))
        self.groups = {g.name: g for g in sc.groups}
        self._kinds = tuple(GroupKind(g.name, g.spot) for g in sc.groups)
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self.nodes: list[PoolNode] = []
        """Every node the run had (gone ones too: they are billed)."""
        self.live: list[PoolNode] = []
        """The nodes not gone."""
        self._names = itertools.count()
        self.queue: deque[Job] = deque()
        self.queued_tokens = 0
        self.local_free = [0.0] * sc.num_local_prefill
        self.link_free_s = 0.0
        self.link_busy_s = 0.0
        self._link_mark = (0.0, 0.0)
        """(time, link busy seconds then): the link's utilisation is measured since the last
        look of the autoscaler."""
        self.link_rate = sc.link_gbps * 1e9 / 8
        self.ttft: list[float] = []
        self.arrivals: list[float] = []
        """Each served request's arrival, in the order of ``ttft``."""
        self.num_offloaded = 0
        self.num_local_for_capacity = 0
        self.events: list[ScaleEvent] = []
        self.samples: list[Sample] = []
        self.num_preemptions = 0
        self.num_finished_on_notice = 0
        self.num_requeued_on_notice = 0
        self.num_fallbacks = 0
        self.num_lost = 0
        self._offered = OfferedRate(sc.rate_window_s, sc.tick_s)
        self.offered_log: list[tuple[float, int]] = []
        """Every long prompt offered to the pool (arrival s, tokens), for the steady-state bound."""
        self._prefilled_tokens = 0
        self._busy_s = 0.0
        self._arrivals = iter(arrivals)
        self.num_requests = 0
        for g in sc.groups:
            for _ in range(g.initial_nodes):
                self._launch(g, ready_now=True)
            if g.preemption.trace:
                self._push(0.0, _AVAIL, g.name)
        if self.autoscaler is not None:
            self._push(0.0, _TICK, None)

    # -- the loop ---------------------------------------------------------------------------------
    def _push(self, at_s: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (at_s, kind, next(self._seq), payload))

    def run(self) -> ElasticReport:
        self._next_arrival()
        handlers = (self._on_arrive, self._on_ready, self._on_done, self._on_notice,
                    self._on_gone, self._on_tick, self._on_avail)  # fmt: skip
        while self._heap:
            at_s, kind, _, payload = heapq.heappop(self._heap)
            if kind in (_TICK, _AVAIL, _NOTICE) and at_s > self.duration_s and self._idle():
                continue  # the run is over: no more looks, availability changes or notices
            self.now = at_s
            handlers[kind](payload)
        return self._report()

    def _idle(self) -> bool:
        return not self.queue and not any(n.job for n in self.live)

    def _next_arrival(self) -> None:
        a = next(self._arrivals, None)
        if a is not None:
            self._push(a.arrival_s, _ARRIVE, a)

    # -- arrivals and placement -------------------------------------------------------------------
    def _on_arrive(self, a: Arrival) -> None:
        self._next_arrival()
        self.num_requests += 1
        sc = self.sc
        if a.num_prompt_tokens <= sc.threshold_tokens:
            self._local(a.arrival_s, a.num_prompt_tokens)
            return
        self._offered.add(self.now, a.num_prompt_tokens)
        self.offered_log.append((self.now, a.num_prompt_tokens))
        job = Job(a.index, a.arrival_s, a.num_prompt_tokens)
        local_s = self._local_expected_s(a.num_prompt_tokens)
        serving = [n for n in self.live if n.state is NodeState.SERVING]
        if serving:
            pool_s = self._pool_expected_s(job, serving)
            use_pool = pool_s <= sc.ttft_slo_s or pool_s <= local_s
        else:
            decision = wait_for_starting(
                self.room, self._observe(), arrived_s=self.now, now_s=self.now,
                num_uncached_tokens=job.num_tokens, local_prefill_s=local_s,
                prior_tokens_per_s=self._speed() or 1.0,
            )  # fmt: skip
            use_pool = decision.verdict is WaitVerdict.WAIT
        if not use_pool:
            self.num_local_for_capacity += 1
            self._local(a.arrival_s, a.num_prompt_tokens)
            return
        self.num_offloaded += 1
        self._enqueue(job)

    def _pool_expected_s(self, job: Job, serving: list[PoolNode]) -> float:
        ahead_s = self._prefill_s(max(1, self.queued_tokens // max(1, len(self.queue))))
        backlog_s = len(self.queue) * ahead_s + sum(
            max(0.0, n.job_prefill_end_s - self.now) for n in serving if n.job
        )
        free_now = any(n.job is None for n in serving)
        wait_s = 0.0 if free_now and not self.queue else backlog_s / len(serving)
        return wait_s + self._prefill_s(job.num_tokens) + self._transfer_s(job.num_tokens)

    def _local_expected_s(self, num_tokens: int) -> float:
        return max(0.0, self.local_free[0] - self.now) + self._local_prefill_s(num_tokens)

    def _local(self, arrival_s: float, num_tokens: int) -> None:
        start = max(self.now, self.local_free[0])  # a heap: the node free first
        end = start + self._local_prefill_s(num_tokens)
        heapq.heapreplace(self.local_free, end)
        self.ttft.append(end - arrival_s)
        self.arrivals.append(arrival_s)

    def _transfer_s(self, num_tokens: int) -> float:
        return num_tokens * self._kv_per_token / self.link_rate

    def _enqueue(self, job: Job, front: bool = False) -> None:
        if front:
            self.queue.appendleft(job)
        else:
            self.queue.append(job)
        self.queued_tokens += job.num_tokens
        self._dispatch()

    def _dispatch(self) -> None:
        if not self.queue:
            return
        for node in self.live:
            if node.state is NodeState.SERVING and node.job is None:
                self._start(node, self.queue.popleft())
                if not self.queue:
                    return

    def _start(self, node: PoolNode, job: Job) -> None:
        self.queued_tokens -= job.num_tokens
        prefill_s = self._prefill_s(job.num_tokens)
        tx_s = self._transfer_s(job.num_tokens)
        end = self.now + prefill_s
        layers = self.cm.model.num_layers
        # Layer-wise: the stream starts with the first layer, ends no sooner than one layer
        # after the prefill, and queues behind the link's earlier streams.
        tx_start = max(self.now, self.link_free_s)
        tx_end = max(end + tx_s / layers, tx_start + tx_s)
        node.job = job
        node.job_start_s = self.now
        node.job_prefill_end_s = end
        node.job_end_s = tx_end
        node.version += 1
        self._push(end, _DONE, (node, node.version, prefill_s, tx_s))

    def _on_done(self, payload: tuple[PoolNode, int, float, float]) -> None:
        node, version, prefill_s, tx_s = payload
        if version != node.version or node.job is None:
            return  # taken away by a notice
        job = node.job
        node.job = None
        if node.job_start_s >= self.sc.measure_from_s:
            node.busy_s += prefill_s
        self._busy_s += prefill_s
        self._prefilled_tokens += job.num_tokens
        # The link carries this stream after those before it (its FIFO share).
        self.link_free_s = max(self.link_free_s, node.job_end_s)
        self.link_busy_s += tx_s
        self.ttft.append(node.job_end_s + self.sc.rtt_s / 2 - job.arrival_s)
        self.arrivals.append(job.arrival_s)
        if node.state is NodeState.DRAINING:
            self._gone(node)
            node.gone_s = max(self.now, node.job_end_s)  # its KV stream still leaves from it
            return
        self._dispatch()

    # -- nodes ------------------------------------------------------------------------------------
    def _launch(self, g: GroupConfig, ready_now: bool = False) -> PoolNode:
        node = PoolNode(f"{g.name}-{next(self._names)}", g.name, g.spot, self.now)
        self.nodes.append(node)
        self.live.append(node)
        if ready_now:
            self._ready(node)
        else:
            self._push(self.now + g.startup_s, _READY, node)
        notice_s = g.preemption.notice_at_s(self.rng, self.now) if g.spot else None
        if notice_s is not None:  # the rate's notice, drawn as the live loop draws it
            self._push(notice_s, _NOTICE, node)
        return node

    def _on_ready(self, node: PoolNode) -> None:
        if node.state is NodeState.STARTING:
            self._ready(node)

    def _ready(self, node: PoolNode) -> None:
        node.state = NodeState.SERVING
        node.ready_s = self.now
        self._dispatch()

    def _gone(self, node: PoolNode) -> None:
        node.state = NodeState.GONE
        node.gone_s = self.now
        self.live.remove(node)

    def _on_notice(self, node: PoolNode) -> None:
        if node.state is NodeState.GONE or node.noticed:
            return
        self.num_preemptions += 1
        self.num_lost += 1
        node.noticed = True
        if node.state is NodeState.STARTING:
            self._gone(node)  # serves nothing yet: nothing to hand back
            return
        deadline = self.now + self.groups[node.group].notice_s
        node.state = NodeState.DRAINING
        job = node.job
        if job is not None:
            if node.job_end_s <= deadline:
                self.num_finished_on_notice += 1
            else:  # would not end in time: hand it back, to the head of the queue
                if node.job_start_s >= self.sc.measure_from_s:
                    node.busy_s += self.now - node.job_start_s
                node.job = None
                node.version += 1
                job.num_requeued += 1
                self.num_requeued_on_notice += 1
                self._enqueue(job, front=True)
        if node.job is None:
            self._gone(node)  # nothing to finish: released at once (billing stops)
        else:
            self._push(deadline, _GONE, node)

    def _on_gone(self, node: PoolNode) -> None:
        if node.state is not NodeState.GONE:
            self._gone(node)

    def _on_avail(self, group: str) -> None:
        g = self.groups[group]
        p = g.preemption
        if not self._spot_available(g):
            for node in list(self.live):
                if node.group == group:
                    self._on_notice(node)
        self._push(self.now + p.interval_s, _AVAIL, group)

    def _spot_available(self, g: GroupConfig) -> bool:
        return g.preemption.available(self.now)

    # -- the autoscaler ---------------------------------------------------------------------------
    def _speed(self) -> float | None:
        return self._prefilled_tokens / self._busy_s if self._busy_s > 0 else None

    def _observe(self) -> GroupObservation:
        starting = tuple(
            max(0.0, n.launched_s + self.groups[n.group].startup_s - self.now)
            for n in self.live
            if n.state is NodeState.STARTING
        )
        mark_s, mark_busy = self._link_mark
        link_util = 0.0
        if self.now > mark_s:
            link_util = min(1.0, (self.link_busy_s - mark_busy) / (self.now - mark_s))
        link = LinkState(LinkId("pool->pd"), self.link_rate, utilisation=link_util)
        return GroupObservation(
            group="pool",
            num_serving=sum(1 for n in self.live if n.state is NodeState.SERVING),
            starting_remaining_s=starting,
            num_draining=sum(1 for n in self.live if n.state is NodeState.DRAINING),
            queued_uncached_tokens=self.queued_tokens,
            offered_tokens_per_s=self._offered.per_s(self.now),
            prefill_tokens_per_s_per_node=self._speed(),
            link=link,
            kv_bytes_per_token=self._kv_per_token,
            num_lost=self.num_lost,
        )

    def _on_tick(self, _: None) -> None:
        assert self.autoscaler is not None
        obs = self._observe()
        self._link_mark = (self.now, self.link_busy_s)
        d = self.autoscaler.decide(obs, self.now)
        self.samples.append(Sample(self.now, obs.num_serving, obs.num_starting,
                                   obs.offered_tokens_per_s, d.desired_nodes))  # fmt: skip
        if d.action is ScaleAction.ADD:
            self.events.append(ScaleEvent(self.now, "add", d.num_nodes, d.reason))
            for _k in range(d.num_nodes):
                self._add_one()
        elif d.action is ScaleAction.DRAIN:
            self.events.append(ScaleEvent(self.now, "drain", d.num_nodes, d.reason))
            for _k in range(d.num_nodes):
                self._drain_one()
        self._push(self.now + self.sc.tick_s, _TICK, None)

    def _add_one(self) -> None:
        choice = group_for_add(self._kinds, lambda name: self._spot_available(self.groups[name]))
        if choice is not None:
            self.num_fallbacks += choice.fallback
            self._launch(self.groups[choice.group])

    def _drain_one(self) -> None:
        live = [n for n in self.live if n.state in (NodeState.STARTING, NodeState.SERVING)]
        views = [
            PoolNodeView(n.node_id, n.group, n.spot, n.state is NodeState.STARTING,
                         n.job is not None)
            for n in live
        ]  # fmt: skip
        chosen = node_to_drain(views)
        if chosen is None:
            return
        node = live[views.index(chosen)]
        if node.state is NodeState.STARTING or node.job is None:
            self._gone(node)
        else:
            node.state = NodeState.DRAINING

    # -- the report -------------------------------------------------------------------------------
    def _bound(self) -> tuple[tuple[float, int], ...]:
        """Nodes per interval at steady state (ignores start-up): ``bound.py``."""
        c = self.sc.autoscale
        util = c.up_utilisation if c is not None else 0.8
        return pool_bound(
            self.offered_log, self.sc.threshold_tokens, self._prefill_s,
            self.sc.bound_interval_s, util, self.duration_s,
        )  # fmt: skip

    def _report(self) -> ElasticReport:
        end_s = max(self.duration_s, self.now)
        from_s = self.sc.measure_from_s
        hours = []
        for g in self.sc.groups:
            price = g.usd_per_hour
            if price is None:
                price = ASSUMED_USD_PER_GPU_HOUR.get(g.hardware, 0.0) * GPUS_PER_NODE
            members = [n for n in self.nodes if n.group == g.name]
            hours.append(group_hours(g.name, g.spot, members, end_s, price, from_s))
        slo = self.sc.ttft_slo_s
        ttft = [t for t, a in zip(self.ttft, self.arrivals, strict=True) if a >= from_s]
        met = sum(1 for t in ttft if t <= slo)
        return ElasticReport(
            groups=tuple(hours),
            num_requests=self.num_requests,
            num_completed=len(self.ttft),
            num_measured=len(ttft),
            num_offloaded=self.num_offloaded,
            num_local_for_capacity=self.num_local_for_capacity,
            ttft_p50_s=percentile(ttft, 0.5),
            ttft_p90_s=percentile(ttft, 0.9),
            attainment=met / len(ttft) if ttft else 1.0,
            scale_events=tuple(e for e in self.events if e.at_s >= from_s),
            num_preemptions=self.num_preemptions,
            num_finished_on_notice=self.num_finished_on_notice,
            num_requeued_on_notice=self.num_requeued_on_notice,
            num_fallbacks=self.num_fallbacks,
            samples=tuple(self.samples),
            bound=self._bound(),
        )
