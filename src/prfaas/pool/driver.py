"""``PlacementDriver``: the pool's live placement loop (``docs/pool.md``).

It carries out ``FrontDoor.place`` on the pool's node processes: it keeps the nodes that
registered with the front door's node listener (and heartbeat, ``serve.node.control_plane``),
and whenever a live node of a group is free it asks the door what that node should run; the
prefill goes to the node through the node API every PrfaaS node speaks (``POST
/nodes/{node}/prefill/stream``, ``serve.gateway.node_client.HttpNodeClient.prefill_streamed``,
signed with the pool's internal key), whose KV streams layer by layer from the node straight to
the tenant's registered receiver, on a link authenticated with the tenant's key
(``PrefillCommand.key_id``) and paced on the tenant's own route at the rate the tenant registered
(``PrefillCommand.tenant``, ``tenant_link_gbps``; the node's egress cap over all of them).

A node is held (``busy``) while it *computes*: its answer's first line, ``computed`` (the last
layer computed and handed to the link), frees it for its next placement (``FrontDoor.computed``:
the admission's ``running`` on the group follows), while the prefill stays running at the door
until the answer's outcome (the KV verified at the receiver, or why not): that is the outcome the
tenant reads, ``done``, or ``failed`` with the reason (``node_lost`` when the node could not be
reached, or its answer was cut before the outcome, even after ``computed``), and until then its KV
counts as unsent, an abort still goes to its node, a hand-back still re-queues it. A tenant whose
receiver is slow to verify so holds no pool node idle.

Spot notices: a node that got a notice (SIGTERM on a group with ``notice_s``, or ``POST
/notice``) answers the prefills it will not end by its deadline ``handed_back``, and refuses new
ones (409) until it is gone. Either way the prefill is no failure: ``FrontDoor.requeue`` puts it
back at the front of its tenant's queue (the tenant's outcome stays pending, ``queued``), its
payload is kept until it really ends, the node is offered nothing more (it is leaving: its next
heartbeat says draining too), and another node of the group serves it, streaming to the same
receiver and session: the command says so (``keep_session_on_hand_back``), so the noticed node
aborts its KV session with ``AbortCode.HANDED_BACK`` and the tenant's decode node keeps
expecting the session instead of failing it (``serve.node.worker``). Counted per tenant
(``handed_back``); a prefill handed back more than ``frontdoor.MAX_HAND_BACKS`` times fails.

Leases: every tick the door's ``expire`` drops a silent tenant's queued prefills and aborts its
running ones at their nodes; a tenant's ``POST /v1/abort`` (its client went away) does the same
for one prefill. Egress: the unsent KV is counted per tenant as the whole KV of each
running prefill (what the admission's egress window reads), and each tenant's own link is the
rate it told when it registered its receivers (``FrontDoor.link_of``): a tenant whose unsent KV
is over ``egress_window_s`` of its own link starts no more prefills (a tenant that told none is
not held by it). Link readings: every node heartbeat's per-route reports are kept (the latest per
process); ``tenant_link`` is a tenant's own route as the live processes report it (the
feedback's ``link``: ``pool.tenant_links``).

Prefixes: every prefill command asks the node to look up and store the prompt's prefix
(``store_prefix``, ``use_cached_tokens`` the whole prompt); the node hashes it into the tenant's
own namespace itself (``serve.node.prefix_namespaces``), so the command carries no hashes. Each
heartbeat's per-namespace figures are kept (the latest per process); ``tenant_prefixes`` is a
tenant's own namespace per group over the live processes (the feedback's ``prefixes``:
``pool.tenant_prefixes``), and a done prefill's outcome says how many tokens its node found.
With ``prefix_hits`` (``pool.prefix_hits``: each process's store mirrored from its heartbeat's
journal, acknowledged in the answer, ``take_prefix_ack``), placement is cache-aware: a group's
free nodes are offered together, and the prefill the door picks goes to the one whose store holds
the longest prefix of its prompt in its tenant's namespace (the door computes the salted chain:
it holds the internal key), charged the compute that node will do (``FrontDoor.place``).

Counters per tenant (``counters``): accepted, placed, done, failed, aborted, handed_back (each
time a node gave one back; a prefill placed again counts placed again), and the charge
corrections: refunded, surcharged (a done prefill whose node found more, or less, of its prompt
than the placement expected: ``FrontDoor.finished`` trued its tenant's charge up): the operator's
listener serves them. Time: the door's ``now`` is modelled seconds (``clock``); node liveness is
wall seconds (``wall``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prfaas.cache.mirror import ReportAck
from prfaas.core.link_report import SenderLinkReport
from prfaas.policy.pool_admission import EgressState, PrefillJob
from prfaas.policy.pool_shares import TenantShare
from prfaas.pool.frontdoor import Abort, FrontDoor, Placement
from prfaas.pool.payload import Payload
from prfaas.pool.prefix_hits import PrefixHits
from prfaas.pool.tenant_links import LinkReading, combine, tenant_route
from prfaas.pool.tenant_prefixes import GroupPrefixes
from prfaas.pool.tenant_prefixes import combine as combine_prefixes
from prfaas.serve.gateway.node_client import NodeCallFailed
from prfaas.serve.node.messages import (
    Heartbeat,
    NodeEndpoint,
    PrefillCommand,
    PrefillOutcome,
    PrefixNamespaceMsg,
    Registration,
)

TICK_S = 0.01
"""How often free nodes are offered work and leases checked (wall seconds)."""
log = logging.getLogger("prfaas.pool")


class PoolNodeCalls(Protocol):
    """What the driver calls on the pool's nodes (``HttpNodeClient`` live; in-memory nodes in
    tests)."""

    async def prefill_streamed(
        self, ep: NodeEndpoint, cmd: PrefillCommand, computed: Callable[[], None]
    ) -> PrefillOutcome:
        """Run the prefill; ``computed()`` once the node computed it and handed its KV to the
        link (not at all if it fails first); returns its outcome once the KV is verified at the
        receiver, or why not (``NodeCallFailed``: no outcome came)."""
        ...

    async def abort(self, ep: NodeEndpoint, request_id: str) -> None: ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class _PoolNode:
    endpoint: NodeEndpoint
    process: str
    group: str
    last_seen_s: float
    fault: str = ""
    draining: bool = False
    """The node said it is draining (a spot notice, ``prfaas drain``, a pod stopping): it
    finishes what it runs and is offered nothing new, which it would refuse."""


class PlacementDriver:
    def __init__(
        self,
        door: FrontDoor,
        node_groups: Mapping[str, str],
        client: PoolNodeCalls,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.monotonic,
        node_timeout_s: float = 3.0,
        prefix_hits: PrefixHits | None = None,
    ) -> None:
        """``node_groups``: node name -> its group (the pool file's); ``clock``: the door's
        (modelled seconds); ``wall``: node liveness (wall seconds); ``prefix_hits``: the nodes'
        stores as they report them (None: placement and charges ignore the pool's prefixes)."""
        self.door = door
        self.node_groups = dict(node_groups)
        self.client = client
        self.clock = clock
        self.wall = wall
        self.node_timeout_s = node_timeout_s
        self.nodes: dict[str, _PoolNode] = {}
        self.payloads: dict[tuple[str, str], Payload] = {}
        """Accepted prefills' payloads, kept until each ends (a handed-back one is placed
        again)."""
        self.busy: dict[str, tuple[str, str]] = {}
        """node -> (tenant, request id) it runs."""
        self._unsent: dict[tuple[str, str], tuple[str, float]] = {}
        """(tenant, request id) -> (tenant, KV bytes) of running prefills (the egress backlog)."""
        self._sessions: dict[tuple[str, str], str] = {}
        """(tenant, request id) -> the session its node runs it under (what an abort names)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.counters: dict[str, Counter[str]] = {t.name: Counter() for t in door.shape.tenants}
        self.link_reports: dict[str, tuple[SenderLinkReport, ...]] = {}
        """process -> its last heartbeat's link readings (one per route: per tenant)."""
        self.prefix_reports: dict[str, tuple[PrefixNamespaceMsg, ...]] = {}
        """process -> its last heartbeat's prefix store, per tenant namespace."""
        self.prefix_hits = prefix_hits
        self._prefix_acks: dict[str, ReportAck] = {}
        """process -> the acknowledgement of its last journal, for the heartbeat's answer."""
        self._hints = _Hints(self) if prefix_hits is not None else None

    # -- the node listener ---------------------------------------------------------------------
    def register(self, reg: Registration) -> None:
        now = self.wall()
        for ep in reg.nodes:
            group = self.node_groups.get(ep.node)
            if group is None:
                raise ValueError(f"node {ep.node!r} is not in the pool file")
            self.nodes[ep.node] = _PoolNode(ep, reg.process, group, now)
            if self.prefix_hits is not None:
                self.prefix_hits.registered(reg.process, group)

    def heartbeat(self, beat: Heartbeat) -> bool:
        mine = [n for n in self.nodes.values() if n.process == beat.process]
        if not mine:
            return False
        now = self.wall()
        reports = {r.node: r for r in beat.reports}
        self.link_reports[beat.process] = tuple(beat.links)
        self.prefix_reports[beat.process] = tuple(beat.namespaces)
        if self.prefix_hits is not None and beat.prefix is not None:
            ack = self.prefix_hits.report(beat.process, beat.prefix)
            if ack is not None:
                self._prefix_acks[beat.process] = ack
        for n in mine:
            n.last_seen_s = now
            report = reports.get(n.endpoint.node)
            n.fault = report.fault if report is not None else ""
            n.draining = report is not None and report.draining
        return True

    def take_prefix_ack(self, process: str) -> ReportAck | None:
        """The acknowledgement of the process's last prefix journal, for the heartbeat's answer
        (once: a heartbeat without a journal gets none)."""
        return self._prefix_acks.pop(process, None)

    def live(self, node: str) -> bool:
        n = self.nodes.get(node)
        return n is not None and not n.fault and self.wall() - n.last_seen_s <= self.node_timeout_s

    def live_nodes(self) -> list[str]:
        return sorted(n for n in self.nodes if self.live(n))

    def tenant_link(self, tenant: str) -> LinkReading | None:
        """``tenant``'s own link as the live node processes last reported it (None: none has a
        route to it yet); never another tenant's route."""
        groups: dict[str, str] = {}
        for name, n in self.nodes.items():
            if self.live(name):
                groups[n.process] = n.group
        found = [
            r
            for process, group in sorted(groups.items())
            for r in self.link_reports.get(process, ())
            if r.link == tenant_route(group, tenant)
        ]
        return combine(found)

    def tenant_prefixes(self, tenant: str) -> tuple[GroupPrefixes, ...]:
        """What the live node processes hold for ``tenant``, per group: its own namespace (or
        the shared one), never another tenant's."""
        groups = {n.process: n.group for name, n in self.nodes.items() if self.live(name)}
        return combine_prefixes(
            tenant, ((g, self.prefix_reports.get(p, ())) for p, g in sorted(groups.items()))
        )

    # -- the tenants' side ---------------------------------------------------------------------
    def accept(self, payload: Payload) -> None:
        """An accepted submit's payload, kept until the prefill ends (a repeated submit of a
        prefill already accepted changes nothing)."""
        key = (payload.tenant, payload.request_id)
        out = self.door.outcome(*key)
        if out is None or out.state != "queued" or key in self.payloads:
            return
        self.payloads[key] = payload
        self.counters[payload.tenant]["accepted"] += 1

    # -- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(TICK_S)

    def tick(self) -> None:
        now = self.clock()
        for abort in self.door.expire(now):
            self._aborted(abort)
        free: dict[str, list[str]] = {}  # group -> its free live nodes, by name
        for name in sorted(self.nodes):
            if name not in self.busy and self.live(name) and not self.nodes[name].draining:
                free.setdefault(self.nodes[name].group, []).append(name)
        # Nodes are offered work by name, as before; each placement may go to another free node
        # of the group (the one holding the longest prefix of the prompt for its tenant).
        for name in sorted(self.nodes):
            group = self.nodes[name].group
            nodes = free.get(group, [])
            while name in nodes:
                placement = self.door.place(group, nodes[0], now, self.egress(), nodes[1:],
                                            self._hints)  # fmt: skip
                if placement is None:
                    nodes.clear()  # nothing the group can start now: its other nodes neither
                    break
                nodes.remove(placement.node)
                self._start(placement)

    def abort(self, tenant: str, request_id: str) -> bool:
        """The tenant gave up on ``request_id``: dropped from the queue, or stopped at its node;
        False when the door holds no such prefill of this tenant (unknown, ended)."""
        abort = self.door.abort(tenant, request_id, self.clock())
        if abort is None:
            return False
        self._aborted(abort)
        return True

    def set_tenants(self, shares: Sequence[TenantShare]) -> tuple[Abort, ...]:
        """A reload of the tenant list (``FrontDoor.set_tenants``): a tenant left without a key
        has its queued prefills dropped and its running ones stopped at their nodes."""
        for share in shares:
            self.counters.setdefault(share.name, Counter())
        aborts = self.door.set_tenants(shares, self.clock())
        for abort in aborts:
            self._aborted(abort)
        return aborts

    def _aborted(self, abort: Abort) -> None:
        self._drop_payload((abort.tenant, abort.request_id))
        self.counters[abort.tenant]["aborted"] += 1
        if abort.node is not None:
            self._spawn(self._abort(abort.node, abort.tenant, abort.request_id))

    def egress(self) -> EgressState:
        """What the admission reads of the egress now (the feedback's link backlog too): each
        tenant's unsent KV and its own link's rate."""
        per: dict[str, float] = {}
        for tenant, num_bytes in self._unsent.values():
            per[tenant] = per.get(tenant, 0.0) + num_bytes
        return EgressState(sum(per.values()), tuple(sorted(per.items())), self.door.tenant_links())

    def _start(self, p: Placement) -> None:
        key = (p.job.tenant, p.job.request_id)
        payload = self.payloads.get(key)
        if payload is None:  # accepted without a payload: cannot be run
            self._drop_payload(key)
            self.door.finished(*key, self.clock(), error="no_payload")
            self.counters[p.job.tenant]["failed"] += 1
            return
        self.busy[p.node] = key
        self._unsent[key] = (p.job.tenant, float(p.job.kv_bytes))
        self._sessions[key] = p.session
        self.counters[p.job.tenant]["placed"] += 1
        link = self.door.link_of(p.job.tenant)
        cmd = PrefillCommand(
            request_id=p.session,  # the receiver's session: what its decode node expects
            tokens=payload.tokens,
            # The node hashes the prompt into the tenant's namespace and finds what it holds.
            use_cached_tokens=payload.num_tokens,
            store_prefix=True,
            decode_node=p.receiver.name,
            decode_host=p.receiver.host,
            decode_transfer_port=p.receiver.transfer_port,
            cross_site=True,
            receiver_cached_tokens=payload.receiver_cached_tokens,
            decode_recomputes_last_token=payload.decode_recomputes_last_token,
            sampling=payload.sampling,
            key_id=payload.key_id,
            tenant=p.job.tenant,  # its KV on the tenant's own route at the node
            tenant_link_gbps=None if link is None else link.gbps,
            keep_session_on_hand_back=True,  # a handed-back prefill is placed again, same session
        )
        self._spawn(self._prefill(p.node, key, cmd))

    async def _prefill(self, node: str, key: tuple[str, str], cmd: PrefillCommand) -> None:
        error = ""
        back = ""  # the node gave it back unfinished: why
        sent = 0
        cached = 0
        try:
            outcome: PrefillOutcome = await self.client.prefill_streamed(
                self.nodes[node].endpoint, cmd, lambda: self._computed(node, key)
            )
            if outcome.handed_back:
                back = outcome.error or "handed back"
            elif not outcome.ok:
                error = f"prefill: {outcome.error}"[:200]
            sent = outcome.kv_bytes_sent
            cached = outcome.num_cached_tokens
            n = self.nodes.get(node)
            if self.prefix_hits is not None and n is not None and outcome.ok:
                self.prefix_hits.stored(n.process, outcome, self.wall())
        except NodeCallFailed as exc:
            if exc.kind == "refused":  # 409: a notice came before its heartbeat said draining
                back = str(exc)
            else:
                error = "node_lost" if exc.kind == "unreachable" else f"node_{exc.kind}"
                log.warning("pool node %s: prefill %s failed: %s", node, key, exc)
        finally:
            if self.busy.get(node) == key:  # an abort freed the node and it took another since
                del self.busy[node]
            self._unsent.pop(key, None)
            self._sessions.pop(key, None)
        if back:
            self._handed_back(node, key, back)
            return
        # (Before the payload goes: the true-up prices the prompt past the real hit from it.)
        delta = self.door.finished(*key, self.clock(), error=error, kv_bytes_sent=sent,
                                   cached_tokens=cached)  # fmt: skip
        if delta:
            self.counters[key[0]]["refunded" if delta < 0 else "surcharged"] += 1
        self._drop_payload(key)
        out = self.door.outcome(*key)
        if out is not None and out.state in ("done", "failed"):
            self.counters[key[0]][out.state] += 1

    def _computed(self, node: str, key: tuple[str, str]) -> None:
        """``node`` computed ``key`` and handed its KV to the link: the node takes its next
        placement now (the next tick), while ``key`` stays running at the door (its outcome,
        its unsent KV, its session for an abort) until its node's outcome ends it."""
        if self.busy.get(node) != key:
            return  # aborted meanwhile: the node was freed then
        del self.busy[node]
        self.door.computed(*key, self.clock())

    def _handed_back(self, node: str, key: tuple[str, str], why: str) -> None:
        """``node`` gave ``key`` back unfinished (a spot notice): it is leaving, so it is offered
        nothing more (a restarted process registers afresh), and the door queues the prefill
        again at the front of its tenant's queue, or fails it after too many returns."""
        n = self.nodes.get(node)
        if n is not None:
            n.draining = True
        out = self.door.requeue(*key, self.clock(), why)
        if out is None:  # aborted meanwhile (the tenant gave up, its lease ran out)
            return
        self.counters[key[0]]["handed_back"] += 1
        log.warning("pool node %s handed %s back (%s): %s", node, "/".join(key), why,
                    "queued again" if out.state == "queued" else out.reason)  # fmt: skip
        if out.state == "failed":
            self._drop_payload(key)
            self.counters[key[0]]["failed"] += 1

    async def _abort(self, node: str, tenant: str, request_id: str) -> None:
        n = self.nodes.get(node)
        if n is None:
            return
        key = (tenant, request_id)
        if self.busy.get(node) == key:  # (computed already: the node runs another one now)
            del self.busy[node]
        self._unsent.pop(key, None)
        session = self._sessions.pop(key, None)
        if session is not None:
            await self.client.abort(n.endpoint, session)

    def _drop_payload(self, key: tuple[str, str]) -> None:
        """The prefill ended (will not be placed again): its payload and chain go."""
        self.payloads.pop(key, None)
        if self.prefix_hits is not None:
            self.prefix_hits.forget(*key)

    def _spawn(self, coro: object) -> None:
        assert asyncio.iscoroutine(coro)
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await self.client.aclose()


class _Hints:
    """The driver's ``PlacementHints``: a queued prefill's expected hit on a node, from the
    node's process's mirrored store and the prompt's chain in its tenant's namespace, and its
    compute there (the prompt less that hit)."""

    def __init__(self, driver: PlacementDriver) -> None:
        self.driver = driver

    def _num_tokens(self, payload: Payload) -> int:
        # A decode node that recomputes the last token may get one token fewer from the node
        # (models with fixed-size states): the shorter prompt is the safe bound of the lookup.
        return payload.num_tokens - (1 if payload.decode_recomputes_last_token else 0)

    def hit_tokens(self, job: PrefillJob, node: str) -> int:
        d = self.driver
        hits, n = d.prefix_hits, d.nodes.get(node)
        payload = d.payloads.get((job.tenant, job.request_id))
        if hits is None or payload is None or n is None:
            return 0
        chain = hits.chain(job.tenant, job.request_id, payload.tokens)
        return hits.hit_tokens(n.process, chain, self._num_tokens(payload), d.wall())

    def compute_s(self, job: PrefillJob, cached_tokens: int) -> float:
        d = self.driver
        hits, payload = d.prefix_hits, d.payloads.get((job.tenant, job.request_id))
        if hits is None or hits.compute_s is None or payload is None:
            return job.compute_s
        # The node computes the whole prompt past what it finds in its own store (the tenant's
        # home cache is not there): what its group's compute is charged.
        num_new = max(1, payload.num_tokens - cached_tokens)
        return hits.compute_s(job.model, num_new, cached_tokens)
