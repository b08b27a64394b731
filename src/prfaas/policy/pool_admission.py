"""``PoolAdmission``: the pool front door's one admission, queueing and fair-share object.

The simulator (``sim/pool_sim.py``) and the live front door call the same object; a single-gateway
deployment is the one-tenant case (``PoolShape.one_tenant``).

The rule (``docs/pool.md`` states it and what it promises): **weighted dominant-resource fair
queueing with VTC lifting, work-conserving.** The shared resources are each node group's compute
(node-seconds, capacity ``num_nodes`` per second) and the pool's total egress (bytes, capacity
``egress_bytes_per_s``). A prefill's *dominant cost* is the larger of its two normalised costs,
``compute_s / num_nodes`` and ``kv_bytes / egress_bytes_per_s`` (seconds of the whole resource it
occupies). Every tenant has a virtual counter; a started prefill adds its dominant cost / weight.
Whenever a node of a group is free and the egress has room for the tenant (its unsent KV under
``egress_window_s`` of its own link, and either the pool's unsent KV under ``egress_window_s`` of
the pool's egress or its own under its weighted part of that), the backlogged tenant with the
lowest counter starts its oldest prefill for that group (tenants under their floor on that group
first). A tenant that becomes backlogged again is lifted to the lowest counter of the backlogged
tenants (Sheng et al., VTC, OSDI'24): it is not owed its idle time. Nothing waits while a node
and the egress are free and some tenant has work (work-conserving). Where the caller knows the
pool's prefixes (the live driver), a start is charged the compute of the node it goes to, the
prompt less that node's prefix of it (``dispatch``'s ``compute_s_of``, ``pool_placement``); the
egress part is always the KV that leaves. A started prefill holds its node (its tenant's
``running`` on the group) until its compute ends (``computed``: the live node handed its last
layer to the link; the simulator's node is free at compute end), not until its KV is verified at
the tenant: its charge and its KV's egress are held until it ends (``finish``, ``requeue``).
**Trued up at the outcome**: a done prefill whose node found more (less) of its prompt than the
start expected is charged what it really computed (``finish(..., compute_s=)``: the difference of
the two charges, at the weight its start was charged with, refunded or surcharged), as if its
start had been charged so; a requeue's refund is the same correction (to nothing). "As if at its
start": a VTC lift since then (the tenant went idle while the prefill's KV was still on its way,
and came back) absorbs it (``policy.vtc_counter``): a refund never takes a lifted tenant below
the lift, nor does a surcharge add what the lift already added. A
prefill's compute is priced by ``prefill_node_s``:
the forward pass and the node process's fixed per-request CPU (the profile's measured
``prefill_per_request_s``), the node-seconds it really holds its node for; the live front door and
the pool simulator price with that one function.

Pure: ``now`` is passed in, decisions are frozen dataclasses; no I/O, no clock, no asyncio.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from prfaas.perf import CostModel
from prfaas.policy.pool_shares import PoolShape, TenantShare, waterfill
from prfaas.policy.vtc_counter import LiftedCounter

REFUSAL_REASONS = (
    "unknown_tenant",
    "unknown_model",
    "over_queued_tokens_cap",
    "over_rate_cap",
)


def prefill_node_s(cost: CostModel, num_new: int, num_cached: int = 0) -> float:
    """What a pool prefill costs its node, in node-seconds (its ``PrefillJob.compute_s``): the
    group profile's forward pass and the node process's CPU around it
    (``plumbing.prefill_overhead_s``: per request, its HTTP call, the KV session's set-up, the
    first token; per uncached token, the engine's work around its passes; the passes' own
    in-service excess over the profile's curve), paid on that node.
    Both the live front door's price (``pool/service.py``) and the pool simulator's (which also
    runs its nodes for this long)."""
    passes_s = cost.prefill_s(num_new, num_cached)
    return passes_s + cost.plumbing.prefill_overhead_s(num_new, passes_s)


@dataclass(frozen=True, slots=True)
class PrefillJob:
    """A submitted prefill, costed by the driver from the group's node profile."""

    tenant: str
    request_id: str
    model: str
    num_uncached_tokens: int
    compute_s: float
    """Node-seconds on the model's group (``prefill_node_s``: the node profile's ``T_prefill``
    and its per-request plumbing)."""
    kv_bytes: int
    """What must leave through the pool's egress (uncached suffix + states)."""


@dataclass(frozen=True, slots=True)
class Accepted:
    tenant: str
    request_id: str
    group: str
    expected_start_s: float
    """Absolute time (the caller's clock) the pool expects to start it, from the tenant's queue
    and attainable share; an estimate, not a promise."""


@dataclass(frozen=True, slots=True)
class Refused:
    tenant: str
    request_id: str
    reason: str
    """One of ``REFUSAL_REASONS``."""
    detail: str
    retry_after_s: float | None
    """Seconds after which the same submit may be accepted; None: never (fix the request)."""


Decision = Accepted | Refused


@dataclass(frozen=True, slots=True)
class EgressState:
    """What the driver knows of the egress: unsent KV bytes, the pool's and each tenant's, and
    each tenant's own link rate (a tenant's link is its own constraint, never shared)."""

    pool_backlog_bytes: float = 0.0
    tenant_backlog_bytes: tuple[tuple[str, float], ...] = ()
    tenant_link_bytes_per_s: tuple[tuple[str, float], ...] = ()

    def backlog_of(self, tenant: str) -> float:
        return next((b for t, b in self.tenant_backlog_bytes if t == tenant), 0.0)

    def link_of(self, tenant: str) -> float:
        return next((r for t, r in self.tenant_link_bytes_per_s if t == tenant), math.inf)


@dataclass(frozen=True, slots=True)
class PoolFeedback:
    """What a tenant's tuner and router read (only its own)."""

    tenant: str
    now_s: float
    expected_queueing_s: float
    """How long a prefill submitted now would wait before it starts (per group, the worst)."""
    entitled_share: float
    """weight / sum of the weights of the tenants backlogged or active now (with this one)."""
    attainable_share: float
    """Share of the pool this tenant would get if it offered more: the weighted water-fill of
    the others' recent demand with this tenant's unbounded (at least its entitled share)."""
    queued_tokens: int
    running: int
    link_backlog_s: float = 0.0
    """The tenant's own link: its unsent KV at the pool over its link rate (from the driver's
    ``EgressState``; 0 when none was given)."""


@dataclass(frozen=True, slots=True)
class _Charge:
    """What a start added to its tenant's counter, held until the prefill ends."""

    counter: float
    """The counter charge: ``dominant_cost / weight``."""
    weight: float
    """The weight it was charged at: a correction (a refund, a true-up) is at that weight,
    whatever the tenant's weight is by then."""
    seq: int
    """When it started (the admission's event sequence): the counter's terms that predate it
    hold it, later lifts do not."""


@dataclass(slots=True)
class _Tenant:
    share: TenantShare
    order: int
    vtc: LiftedCounter = field(default_factory=LiftedCounter)
    """Its virtual counter (``policy.vtc_counter``: corrections of held charges as if at their
    starts, lifts absorbing them)."""
    queues: dict[str, deque[PrefillJob]] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    queued_tokens: int = 0
    queued_compute_s: dict[str, float] = field(default_factory=dict)
    queued_bytes: float = 0.0
    bucket: float = 0.0
    bucket_at_s: float = 0.0
    demand_acc: float = 0.0
    demand_at_s: float = 0.0

    def backlogged(self) -> bool:
        return any(self.queues.values())

    def active(self) -> bool:
        return self.backlogged() or any(self.running.values())

    @property
    def counter(self) -> float:
        return self.vtc.value


class PoolAdmission:
    """Submit, dispatch, computed, finish; feedback per tenant. See the module docstring for
    the rule."""

    def __init__(self, shape: PoolShape, remember: int = 65536) -> None:
        self.shape = shape
        self._tenants = {t.name: _Tenant(t, i) for i, t in enumerate(shape.tenants)}
        for tn in self._tenants.values():
            tn.bucket = _bucket_depth(tn.share)
            for g in shape.groups:
                tn.queues[g.name] = deque()
                tn.running[g.name] = 0
                tn.queued_compute_s[g.name] = 0.0
        self._decisions: OrderedDict[tuple[str, str], Decision] = OrderedDict()
        self._remember = remember
        self._charged: dict[tuple[str, str], _Charge] = {}
        """(tenant, request id) -> what its start added to its tenant's counter, while it runs
        (what a ``requeue`` refunds, exactly, whatever the tenant's weight is by then; what a
        done prefill's true-up corrects)."""
        self._seq = 0
        """Event sequence: orders starts and lifts (which terms of a counter hold a charge)."""
        self._computed: set[tuple[str, str]] = set()
        """Started prefills whose compute ended (``computed``) but which have not ended: their
        node is no longer counted as theirs, their charge is still held until ``finish``."""
        self.num_refused: dict[str, int] = {r: 0 for r in REFUSAL_REASONS}

    # -- costs ---------------------------------------------------------------------------------
    def dominant_cost(self, job: PrefillJob, compute_s: float | None = None) -> float:
        """``compute_s``: the node-seconds it will take where it is placed (its node holds part
        of the prompt), else the submitted ``job.compute_s``. The egress part is always the KV
        that leaves (``job.kv_bytes``, the tenant's uncached suffix), whatever the node found."""
        group = self.shape.group_for_model(job.model)
        assert group is not None
        compute = job.compute_s if compute_s is None else compute_s
        return max(compute / group.num_nodes, job.kv_bytes / self.shape.egress_bytes_per_s)

    # -- submit --------------------------------------------------------------------------------
    def submit(self, job: PrefillJob, now: float) -> Decision:
        """Accept (queued, with an expected start) or refuse with a reason and a retry hint.
        Idempotent by (tenant, request_id): a repeated submit gets the first answer again."""
        key = (job.tenant, job.request_id)
        if key in self._decisions:
            return self._decisions[key]
        decision = self._decide(job, now)
        if isinstance(decision, Refused):
            self.num_refused[decision.reason] += 1
            return decision  # a refusal is not remembered: the retry may be accepted
        self._decisions[key] = decision
        while len(self._decisions) > self._remember:
            self._decisions.popitem(last=False)
        return decision

    def _decide(self, job: PrefillJob, now: float) -> Decision:
        tn = self._tenants.get(job.tenant)
        if tn is None:
            return Refused(
                job.tenant,
                job.request_id,
                "unknown_tenant",
                f"tenant {job.tenant!r} is not a tenant of this pool",
                None,
            )
        group = self.shape.group_for_model(job.model)
        if group is None:
            served = ", ".join(g.model for g in self.shape.groups)
            return Refused(
                job.tenant,
                job.request_id,
                "unknown_model",
                f"model {job.model!r} is not served here (served: {served})",
                None,
            )
        share = tn.share
        cap = share.max_queued_tokens
        if cap is not None and tn.queued_tokens + job.num_uncached_tokens > cap:
            excess = tn.queued_tokens + job.num_uncached_tokens - cap
            per_token_s = tn.queued_compute_s[group.name] / max(tn.queued_tokens, 1)
            rate = group.num_nodes * self._attainable(tn, now)
            retry = excess * per_token_s / rate if job.num_uncached_tokens <= cap else None
            return Refused(
                job.tenant,
                job.request_id,
                "over_queued_tokens_cap",
                f"{tn.queued_tokens} tokens queued + {job.num_uncached_tokens} > "
                f"max_queued_tokens {cap}",
                retry,
            )
        if share.max_rate_rps is not None:
            depth = _bucket_depth(share)
            tn.bucket = min(depth, tn.bucket + (now - tn.bucket_at_s) * share.max_rate_rps)
            tn.bucket_at_s = now
            if tn.bucket < 1.0:
                retry = (1.0 - tn.bucket) / share.max_rate_rps
                return Refused(
                    job.tenant,
                    job.request_id,
                    "over_rate_cap",
                    f"over max_rate_rps {share.max_rate_rps}",
                    retry,
                )
            tn.bucket -= 1.0
        if not tn.active():
            # VTC: a returning tenant starts no lower than the least-served active tenant, so its
            # idle time is not banked as credit (a tenant ahead keeps its lead: going idle for a
            # moment does not wipe it).
            active = [o.counter for o in self._tenants.values() if o is not tn and o.active()]
            if active:
                tn.vtc.lift(min(active), self._next_seq())
                tn.vtc.prune(self._held(tn.share.name))
        self._note_demand(tn, self.dominant_cost(job), now)
        expected = now + self._wait_s(tn, group.name, now)
        tn.queues[group.name].append(job)
        tn.queued_tokens += job.num_uncached_tokens
        tn.queued_compute_s[group.name] += job.compute_s
        tn.queued_bytes += job.kv_bytes
        return Accepted(job.tenant, job.request_id, group.name, expected)

    # -- dispatch ------------------------------------------------------------------------------
    def dispatch(
        self,
        group: str,
        now: float,
        egress: EgressState,
        compute_s_of: Callable[[PrefillJob], float] | None = None,
    ) -> PrefillJob | None:
        """The prefill a free node of ``group`` should start now, or None (nothing queued, or
        the egress has no room). The driver calls it while it has a free node.

        ``compute_s_of(job)``: the chosen prefill's node-seconds where it will run (called once,
        after the choice: the node that holds the longest prefix of its prompt computes only the
        rest, ``pool_placement``); its start is charged that compute. None: the submitted
        ``compute_s`` (no pool prefix known)."""
        window_bytes = self.shape.egress_bytes_per_s * self.shape.egress_window_s
        pool_full = egress.pool_backlog_bytes >= window_bytes
        active_w = sum(o.share.weight for o in self._tenants.values() if o.active())
        best: _Tenant | None = None
        best_key: tuple[int, float, int] = (2, math.inf, 0)
        for tn in self._tenants.values():
            q = tn.queues[group]
            if not q:
                continue
            link = egress.link_of(tn.share.name)
            if egress.backlog_of(tn.share.name) >= link * self.shape.egress_window_s:
                continue  # its own link is full: its prefills would only queue KV
            if pool_full and egress.backlog_of(tn.share.name) >= (
                window_bytes * tn.share.weight / active_w
            ):
                continue  # the egress is full and this tenant holds its share of it
            under_floor = tn.running[group] < tn.share.floor_for(group)
            key = (0 if under_floor else 1, tn.counter, tn.order)
            if key < best_key:
                best, best_key = tn, key
        if best is None:
            return None
        job = best.queues[group].popleft()
        compute_s = None if compute_s_of is None else compute_s_of(job)
        charge = self.dominant_cost(job, compute_s) / best.share.weight
        best.vtc.add(charge)
        self._charged[(job.tenant, job.request_id)] = _Charge(
            charge, best.share.weight, self._next_seq()
        )
        best.running[group] += 1
        best.queued_tokens -= job.num_uncached_tokens
        best.queued_compute_s[group] = max(0.0, best.queued_compute_s[group] - job.compute_s)
        best.queued_bytes = max(0.0, best.queued_bytes - job.kv_bytes)
        return job

    def computed(self, job: PrefillJob, now: float) -> None:
        """The started prefill's compute ended (its node handed its last layer to the link): its
        node is free for the next one while its KV is still on its way to be verified, so it no
        longer counts among its tenant's ``running`` on the group (floors, expected waits, the
        feedback). It has not ended: ``finish`` (verified, failed, aborted) or ``requeue``
        still comes, and its charge stays until then. Once per start; nothing for a prefill not
        running."""
        key = (job.tenant, job.request_id)
        if key not in self._charged or key in self._computed:
            return
        self._computed.add(key)
        self._release_node(job)

    def finish(self, job: PrefillJob, now: float, compute_s: float | None = None) -> float:
        """The prefill ended (done, failed or aborted): its node is free again (if ``computed``
        did not free it already).

        ``compute_s``: a done prefill's node-seconds as its node really ran it (the prompt past
        what the node really found, ``pool_placement.settle_cached``); its start's charge is
        trued up to it: its tenant's counter changes by ``dominant_cost(job, compute_s) /
        weight`` less what the start added, at the weight of the start, as if the start had
        been charged so (a lift since absorbs it: the module docstring). None: the charge stands
        (a failed or aborted prefill; a done one its node ran as expected). Returns the
        correction, the difference of the two charges (negative: refunded, positive:
        surcharged; 0.0: none, or not running); a lift since may absorb some of it."""
        key = (job.tenant, job.request_id)
        if key in self._computed:
            self._computed.discard(key)
        else:
            self._release_node(job)
        charge = self._charged.get(key)
        if charge is None:
            return 0.0  # not charged (ended or requeued already): nothing to correct
        delta = 0.0
        if compute_s is not None:
            delta = self.dominant_cost(job, compute_s) / charge.weight - charge.counter
        self._settle(key, delta)
        return delta

    def _release_node(self, job: PrefillJob) -> None:
        group = self.shape.group_for_model(job.model)
        assert group is not None
        tn = self._tenants[job.tenant]
        tn.running[group.name] = max(0, tn.running[group.name] - 1)

    def requeue(self, job: PrefillJob, now: float) -> None:
        """A running prefill came back unfinished (its node got a spot notice and would not end
        it in time): it is queued again at the front of its tenant's queue for its group (it
        keeps its place), and the counter charge of its start is refunded (it is charged again
        when it starts anew: one prefill, paid once)."""
        group = self.shape.group_for_model(job.model)
        assert group is not None
        tn = self._tenants[job.tenant]
        key = (job.tenant, job.request_id)
        if key in self._computed:  # handed back while its KV was on its way: node freed already
            self._computed.discard(key)
        else:
            self._release_node(job)
        charge = self._charged.get(key)
        if charge is not None:  # refunded as if never charged (a lift since absorbs it)
            self._settle(key, -charge.counter)
        tn.queues[group.name].appendleft(job)
        tn.queued_tokens += job.num_uncached_tokens
        tn.queued_compute_s[group.name] += job.compute_s
        tn.queued_bytes += job.kv_bytes

    def cancel(self, tenant: str, request_id: str, now: float) -> PrefillJob | None:
        """Drop one queued prefill (its tenant gave up on it); None when it is not queued."""
        tn = self._tenants.get(tenant)
        if tn is None:
            return None
        for group, q in tn.queues.items():
            job = next((j for j in q if j.request_id == request_id), None)
            if job is None:
                continue
            q.remove(job)
            tn.queued_tokens -= job.num_uncached_tokens
            tn.queued_compute_s[group] = max(0.0, tn.queued_compute_s[group] - job.compute_s)
            tn.queued_bytes = max(0.0, tn.queued_bytes - job.kv_bytes)
            self._decisions.pop((tenant, request_id), None)  # a later submit of it is new
            return job
        return None

    def withdraw(self, tenant: str, now: float) -> tuple[PrefillJob, ...]:
        """Drop a tenant's queued prefills (lease expired, key revoked); returns them."""
        tn = self._tenants[tenant]
        dropped = tuple(j for q in tn.queues.values() for j in q)
        for j in dropped:  # a later submit of the same id is a new request
            self._decisions.pop((j.tenant, j.request_id), None)
        for g, q in tn.queues.items():
            q.clear()
            tn.queued_compute_s[g] = 0.0
        tn.queued_tokens = 0
        tn.queued_bytes = 0.0
        return dropped

    # -- the tenant list (a reload of the pool file) -------------------------------------------
    def set_tenant(self, share: TenantShare, now: float) -> None:
        """Add a tenant, or give a known one this weight, floor and caps from the next decision
        on (its queue, counter and demand are kept). A new tenant starts at the lowest counter of
        the active tenants, as a returning one is lifted at its first submit (VTC): it is owed
        nothing for the time before it joined."""
        tn = self._tenants.get(share.name)
        if tn is None:
            tn = _Tenant(share, len(self._tenants), bucket=_bucket_depth(share), bucket_at_s=now)
            for g in self.shape.groups:
                tn.queues[g.name] = deque()
                tn.running[g.name] = 0
                tn.queued_compute_s[g.name] = 0.0
            active = [o.counter for o in self._tenants.values() if o.active()]
            tn.vtc.reset(min(active, default=0.0), self._next_seq())
            self._tenants[share.name] = tn
        else:
            tn.share = share
            tn.bucket = min(tn.bucket, _bucket_depth(share))
        others = tuple(t for t in self.shape.tenants if t.name != share.name)
        self.shape = replace(self.shape, tenants=(*others, share))

    # -- feedback ------------------------------------------------------------------------------
    def feedback(self, tenant: str, now: float, egress: EgressState | None = None) -> PoolFeedback:
        tn = self._tenants[tenant]
        link_s = 0.0
        if egress is not None:
            link_s = egress.backlog_of(tenant) / egress.link_of(tenant)
        active_w = sum(o.share.weight for o in self._tenants.values() if o.active() or o is tn)
        wait = max(self._wait_s(tn, g.name, now) for g in self.shape.groups)
        return PoolFeedback(
            tenant=tenant,
            now_s=now,
            expected_queueing_s=wait,
            entitled_share=tn.share.weight / active_w,
            attainable_share=self._attainable(tn, now),
            queued_tokens=tn.queued_tokens,
            running=sum(tn.running.values()),
            link_backlog_s=link_s,
        )

    def tenants(self) -> tuple[str, ...]:
        return tuple(self._tenants)

    def counter_of(self, tenant: str) -> float:
        return self._tenants[tenant].counter

    # -- internals -----------------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _settle(self, key: tuple[str, str], delta: float) -> None:
        """The held charge of ``key`` ends, its counter corrected by ``delta`` (the terms that
        started before it: those that hold it)."""
        charge = self._charged.pop(key)
        tn = self._tenants[key[0]]
        if delta != 0.0:
            tn.vtc.add(delta, before=charge.seq)
        tn.vtc.prune(self._held(key[0]))

    def _held(self, tenant: str) -> list[int]:
        """The starts (sequence) of ``tenant``'s charges held now."""
        return [c.seq for (t, _), c in self._charged.items() if t == tenant]

    def _wait_s(self, tn: _Tenant, group: str, now: float) -> float:
        g = self.shape.group(group)
        busy = sum(o.running[group] for o in self._tenants.values())
        if not tn.queues[group] and busy < g.num_nodes:
            return 0.0
        share = self._attainable(tn, now)
        compute = tn.queued_compute_s[group] / (g.num_nodes * share)
        egress = tn.queued_bytes / (self.shape.egress_bytes_per_s * share)
        return max(compute, egress)

    def _note_demand(self, tn: _Tenant, cost: float, now: float) -> None:
        tn.demand_acc = self._decayed(tn, now) + cost
        tn.demand_at_s = now

    def _decayed(self, tn: _Tenant, now: float) -> float:
        dt = max(0.0, now - tn.demand_at_s)
        return tn.demand_acc * math.exp(-dt / self.shape.demand_horizon_s)

    def _attainable(self, tn: _Tenant, now: float) -> float:
        horizon = self.shape.demand_horizon_s
        weights = {o.share.name: o.share.weight for o in self._tenants.values()}
        demands: dict[str, float] = {
            o.share.name: self._decayed(o, now) / horizon for o in self._tenants.values()
        }
        demands[tn.share.name] = math.inf
        return max(waterfill(weights, demands)[tn.share.name], 1e-6)


def _bucket_depth(share: TenantShare) -> float:
    return max(1.0, share.max_rate_rps or 0.0)
