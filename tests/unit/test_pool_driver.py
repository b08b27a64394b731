"""The pool's placement driver (``pool/driver.py``) against in-memory nodes: a free live node gets
the door's placement as a prefill command (the session as its request id, the tenant's key id,
the registered receiver); the answer makes the outcome; an unreachable node is ``node_lost``; a
lease that runs out aborts the running prefill at its node; a silent node gets no work; a
prefill a noticed node hands back (or refuses, 409) is queued again and served by another node
with its payload and session, counted, and fails after too many returns; a node that says it
computed a prefill takes its next one while the first's KV is still being verified, and the
first's outcome (verified, failed, lost with its node, aborted) still ends it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.pool.driver import PlacementDriver
from prfaas.pool.frontdoor import FrontDoor, Receiver, Submit
from prfaas.pool.payload import Payload
from prfaas.serve.gateway.node_client import NodeCallFailed
from prfaas.serve.node.messages import (
    Heartbeat,
    NodeEndpoint,
    PrefillCommand,
    PrefillOutcome,
    Registration,
    SamplingMsg,
)

pytestmark = pytest.mark.timeout(30)


class Nodes:
    def __init__(self, fail: NodeCallFailed | None = None) -> None:
        self.fail = fail
        self.commands: list[tuple[str, PrefillCommand]] = []
        self.aborted: list[tuple[str, str]] = []
        self.release = asyncio.Event()
        self.gates: dict[str, asyncio.Event] = {}
        """Per session: set to end that one prefill alone."""

    async def prefill(self, ep: NodeEndpoint, cmd: PrefillCommand) -> PrefillOutcome:
        self.commands.append((ep.node, cmd))
        gate = self.gates.setdefault(cmd.request_id, asyncio.Event())
        waits = [asyncio.ensure_future(e.wait()) for e in (self.release, gate)]
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in pending:
            w.cancel()
        if self.fail is not None:
            raise self.fail
        return PrefillOutcome(request_id=cmd.request_id, ok=True)

    async def prefill_streamed(
        self, ep: NodeEndpoint, cmd: PrefillCommand, computed: Callable[[], None]
    ) -> PrefillOutcome:
        return await self.prefill(ep, cmd)  # never says computed: the node is held to the end

    async def abort(self, ep: NodeEndpoint, request_id: str) -> None:
        self.aborted.append((ep.node, request_id))

    async def aclose(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _driver(nodes: Nodes, clock: Clock) -> PlacementDriver:
    shape = PoolShape((GroupShape("g", "m", 1),), 1e12, (TenantShare("a"), TenantShare("b")))
    door = FrontDoor(shape, epoch=5, lease_s=3.0, fingerprints={})
    d = PlacementDriver(door, {"n0": "g"}, nodes, clock, wall=clock)  # type: ignore[arg-type]
    ep = NodeEndpoint(node="n0", site="g", role="prefill", host="127.0.0.1", http_port=1)
    d.register(Registration(process="p", nodes=[ep]))
    door.register("a", (Receiver("a-d0", "10.0.0.1", 9000),), clock())
    return d


def _submit(d: PlacementDriver, clock: Clock, rid: str) -> None:
    req = Submit("a", rid, "m", (), 1000, "a-d0", f"s-{rid}", 0.5, 10_000)
    assert d.door.submit("a", req, clock()).status == 200
    d.accept(Payload("a", rid, "a-1", "BQAAAA==", SamplingMsg(max_new_tokens=2)))


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_placement_is_a_prefill_on_the_free_node() -> None:
    nodes, clock = Nodes(), Clock()
    d = _driver(nodes, clock)
    _submit(d, clock, "r1")
    _submit(d, clock, "r2")
    d.tick()
    await _settle()
    assert len(nodes.commands) == 1  # one node, one prefill at a time
    node, cmd = nodes.commands[0]
    assert (node, cmd.request_id, cmd.key_id) == ("n0", "s-r1", "a-1")
    assert (cmd.decode_host, cmd.decode_transfer_port, cmd.cross_site) == ("10.0.0.1", 9000, True)
    nodes.release.set()
    await _settle()
    assert d.door.outcome("a", "r1").state == "done"  # type: ignore[union-attr]
    d.tick()
    await _settle()
    assert d.door.outcome("a", "r2").state == "done"  # type: ignore[union-attr]
    counts = d.counters["a"]
    assert (counts["accepted"], counts["placed"], counts["done"]) == (2, 2, 2)


async def test_an_unreachable_node_is_node_lost() -> None:
    nodes, clock = Nodes(NodeCallFailed("n0", "unreachable", "gone")), Clock()
    d = _driver(nodes, clock)
    _submit(d, clock, "r1")
    d.tick()
    nodes.release.set()
    await _settle()
    out: Any = d.door.outcome("a", "r1")
    assert (out.state, out.reason) == ("failed", "node_lost")
    assert d.counters["a"]["failed"] == 1


async def test_a_lost_lease_aborts_at_the_node_and_a_silent_node_gets_nothing() -> None:
    nodes, clock = Nodes(), Clock()
    d = _driver(nodes, clock)
    _submit(d, clock, "r1")
    d.tick()
    await _settle()
    clock.now += 10.0  # past the lease (3 s) and the node's silence limit (3 s)
    d.tick()
    await _settle()
    assert nodes.aborted == [("n0", "s-r1")]
    out: Any = d.door.outcome("a", "r1")
    assert (out.state, out.reason) == ("aborted", "lease_expired")
    assert not d.live("n0")
    d.door.register("a", (Receiver("a-d0", "10.0.0.1", 9000),), clock())
    _submit(d, clock, "r2")
    d.tick()
    await _settle()
    assert len(nodes.commands) == 1  # the silent node is offered nothing
    assert d.heartbeat(Heartbeat(process="p", reports=[]))
    d.tick()
    await _settle()
    assert [c.request_id for _, c in nodes.commands] == ["s-r1", "s-r2"]


async def test_a_tenants_abort_frees_the_node_and_its_late_answer_frees_nothing() -> None:
    nodes, clock = Nodes(), Clock()
    d = _driver(nodes, clock)
    for rid in ("r1", "r2", "r3"):
        _submit(d, clock, rid)
    d.tick()
    await _settle()
    assert not d.abort("b", "r1")  # another tenant's
    assert d.abort("a", "r1")  # running on n0: stopped there
    await _settle()
    assert nodes.aborted == [("n0", "s-r1")]
    d.tick()  # n0 is free: r2 goes there
    await _settle()
    nodes.gates["s-r1"].set()  # r1's answer comes back late, after r2 was placed
    await _settle()
    d.tick()
    await _settle()
    # n0 still runs r2: r3 waits (r1's answer did not free the node r2 holds)
    assert [c.request_id for _, c in nodes.commands] == ["s-r1", "s-r2"]
    out: Any = d.door.outcome("a", "r1")
    assert (out.state, out.reason) == ("aborted", "client_gone")
    assert d.counters["a"]["aborted"] == 1 and d.counters["a"]["done"] == 0


async def test_a_draining_node_is_offered_nothing_new() -> None:
    """A node whose heartbeat says it is draining (a spot notice, a pod stopping) keeps its
    registration but gets no placement, which it would refuse; back from draining, it does."""
    from prfaas.serve.node.messages import NodeReport

    nodes, clock = Nodes(), Clock()
    d = _driver(nodes, clock)

    def beat(draining: bool) -> None:
        report = NodeReport(node="n0", site="g", role="prefill", draining=draining)
        assert d.heartbeat(Heartbeat(process="p", reports=[report]))

    beat(True)
    _submit(d, clock, "r1")
    d.tick()
    await asyncio.sleep(0)
    assert nodes.commands == [] and d.live("n0")
    beat(False)
    d.tick()
    await asyncio.sleep(0)
    assert [n for n, _ in nodes.commands] == ["n0"]
    nodes.release.set()
    await d.aclose()


async def test_the_pool_metrics_read_the_driver_per_tenant_and_group() -> None:
    """``/metrics`` (pool/metrics.py): per tenant its prefills by outcome and its queue, per group
    its nodes by state, read from the driver at scrape time."""
    from prometheus_client import generate_latest

    from prfaas.pool.metrics import pool_registry

    nodes, clock = Nodes(), Clock()
    d = _driver(nodes, clock)
    registry = pool_registry(d, lambda: 3)
    assert d.heartbeat(Heartbeat(process="p", reports=[]))
    _submit(d, clock, "r1")
    _submit(d, clock, "r2")
    d.tick()
    await asyncio.sleep(0)
    text = generate_latest(registry).decode()
    assert 'prfaas_pool_tenant_prefills_total{outcome="accepted",tenant="a"} 2.0' in text
    assert 'prfaas_pool_tenant_prefills_total{outcome="placed",tenant="a"} 1.0' in text
    assert 'prfaas_pool_tenant_running{tenant="a"} 1.0' in text
    assert 'prfaas_pool_tenant_queued_tokens{tenant="a"} 1000.0' in text
    assert 'prfaas_pool_tenant_prefills_total{outcome="accepted",tenant="b"} 0.0' in text
    assert 'prfaas_pool_nodes{group="g",state="busy"} 1.0' in text
    assert "prfaas_pool_epoch 5.0" in text and "prfaas_pool_key_reloads_total 3.0" in text
    nodes.release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    text = generate_latest(registry).decode()
    assert 'prfaas_pool_tenant_prefills_total{outcome="done",tenant="a"} 1.0' in text
    await d.aclose()


async def test_the_tenants_link_goes_with_its_prefill_and_its_reading_comes_back_its_own() -> None:
    """The rate a tenant registered travels in its prefill command (its own route at the node),
    bounds its unsent KV (the admission's egress state) and the node's per-route reading of it
    comes back as that tenant's alone; a silent process's readings no longer count."""
    from prfaas.core.link_report import SenderLinkReport
    from prfaas.pool.frontdoor import TenantLink

    nodes, clock = Nodes(), Clock()
    d = _driver(nodes, clock)
    d.door.register("a", (Receiver("a-d0", "10.0.0.1", 9000),), clock(), TenantLink(40.0, 20.0))
    _submit(d, clock, "r1")
    d.tick()
    await _settle()
    (_, cmd) = nodes.commands[0]
    assert (cmd.tenant, cmd.tenant_link_gbps) == ("a", 40.0)
    assert d.egress().tenant_link_bytes_per_s == (("a", 5e9),)
    assert d.egress().backlog_of("a") == 10_000  # the running prefill's whole KV

    def reading(route: str, backlog: int) -> SenderLinkReport:
        return SenderLinkReport(route, 5e9, 5e9, 4e9, "measured", backlog, 0.01)

    links = [reading("g->a", 100), reading("g->b", 200), reading("g->g-tenants", 300)]
    assert d.heartbeat(Heartbeat(process="p", reports=[], links=links))
    a, b = d.tenant_link("a"), d.tenant_link("b")
    assert a is not None and b is not None
    assert (a.backlog_bytes, a.capacity_bytes_per_s, a.num_senders) == (100, 4e9, 1)
    assert b.backlog_bytes == 200
    assert d.tenant_link("c") is None
    clock.now += 10.0  # the node process goes silent: its readings are stale
    assert d.tenant_link("a") is None
    nodes.release.set()
    await d.aclose()


def test_a_tenants_readings_from_several_processes_combine() -> None:
    from prfaas.core.link_report import SenderLinkReport
    from prfaas.pool.tenant_links import combine

    def r(cap: float, basis: str, pace: float | None, backlog: int, rtt: float) -> SenderLinkReport:
        return SenderLinkReport("g->a", 5e9, pace, cap, basis, backlog, rtt)  # type: ignore[arg-type]

    assert combine([]) is None
    both = combine([r(5e9, "configured", 5e9, 10, 0.01), r(3e9, "measured", 5e9, 20, 0.03)])
    assert both is not None
    # a measured estimate wins over a configured one; backlogs add; the worst RTT
    assert (both.capacity_bytes_per_s, both.basis) == (3e9, "measured")
    assert (both.backlog_bytes, both.rtt_s, both.num_senders) == (30, 0.03, 2)
    unpaced = combine([r(0.0, "", None, 0, 0.0)])
    assert unpaced is not None and unpaced.pace_bytes_per_s is None and unpaced.basis == ""


class NoticedNodes(Nodes):
    """``n0`` got a spot notice: it hands back what it runs (or, in ``refuse`` mode, answers 409
    as a node does to a prefill that arrives after its notice); every other node serves."""

    def __init__(self, refuse: bool = False) -> None:
        super().__init__()
        self.refuse = refuse
        self.noticed = {"n0"}

    async def prefill(self, ep: NodeEndpoint, cmd: PrefillCommand) -> PrefillOutcome:
        if ep.node not in self.noticed:
            return await super().prefill(ep, cmd)
        self.commands.append((ep.node, cmd))
        if self.refuse:
            raise NodeCallFailed(ep.node, "refused", "node n0 is not accepting prefills")
        return PrefillOutcome(request_id=cmd.request_id, ok=False, handed_back=True,
                              error=f"handed back: {ep.node} got a notice")  # fmt: skip


def _two_node_driver(nodes: Nodes, clock: Clock) -> PlacementDriver:
    shape = PoolShape((GroupShape("g", "m", 2),), 1e12, (TenantShare("a"), TenantShare("b")))
    door = FrontDoor(shape, epoch=5, lease_s=3.0, fingerprints={})
    d = PlacementDriver(door, {"n0": "g", "n1": "g"}, nodes, clock, wall=clock)  # type: ignore[arg-type]
    for i in range(2):  # one process per node
        ep = NodeEndpoint(node=f"n{i}", site="g", role="prefill", host="127.0.0.1", http_port=i)
        d.register(Registration(process=f"p{i}", nodes=[ep]))
    door.register("a", (Receiver("a-d0", "10.0.0.1", 9000),), clock())
    return d


@pytest.mark.parametrize("refuse", [False, True], ids=["handed_back", "refused_409"])
async def test_a_prefill_a_noticed_node_gives_back_is_served_by_another(refuse: bool) -> None:
    nodes, clock = NoticedNodes(refuse), Clock()
    d = _two_node_driver(nodes, clock)
    _submit(d, clock, "r1")
    d.tick()  # n0 (first in order) takes r1 and gives it back at once
    await _settle()
    out: Any = d.door.outcome("a", "r1")
    assert (out.state, out.reason) == ("queued", "handed_back")  # pending, not failed
    assert ("a", "r1") in d.payloads  # kept until it really ends
    assert d.nodes["n0"].draining  # leaving: offered nothing more
    d.tick()
    await _settle()
    assert [(n, c.request_id) for n, c in nodes.commands] == [("n0", "s-r1"), ("n1", "s-r1")]
    first, second = nodes.commands[0][1], nodes.commands[1][1]
    assert first.keep_session_on_hand_back and second.keep_session_on_hand_back
    assert (second.tokens, second.key_id, second.decode_host) == (
        first.tokens, first.key_id, first.decode_host
    )  # fmt: skip
    nodes.release.set()
    await _settle()
    assert d.door.outcome("a", "r1").state == "done"  # type: ignore[union-attr]
    assert ("a", "r1") not in d.payloads
    counts = d.counters["a"]
    assert (counts["placed"], counts["handed_back"], counts["done"], counts["failed"]) == (
        2, 1, 1, 0
    )  # fmt: skip
    from prometheus_client import generate_latest

    from prfaas.pool.metrics import pool_registry

    text = generate_latest(pool_registry(d, lambda: 0)).decode()
    assert 'prfaas_pool_tenant_prefills_total{outcome="handed_back",tenant="a"} 1.0' in text
    assert 'prfaas_pool_nodes{group="g",state="draining"} 1.0' in text
    await d.aclose()


async def test_a_prefill_handed_back_too_often_fails_and_its_payload_goes() -> None:
    from prfaas.pool.frontdoor import MAX_HAND_BACKS

    nodes, clock = NoticedNodes(), Clock()
    nodes.noticed = {"n0", "n1"}  # every node of the group is being preempted
    d = _two_node_driver(nodes, clock)
    _submit(d, clock, "r1")
    for _ in range(MAX_HAND_BACKS + 1):
        for name in ("n0", "n1"):  # a restarted process registers afresh: not draining
            d.nodes[name].draining = False
        d.tick()
        await _settle()
    out: Any = d.door.outcome("a", "r1")
    assert out.state == "failed" and out.reason.startswith("handed_back:")
    assert len(nodes.commands) == MAX_HAND_BACKS + 1 and ("a", "r1") not in d.payloads
    counts = d.counters["a"]
    assert (counts["handed_back"], counts["failed"]) == (MAX_HAND_BACKS + 1, 1)
    await d.aclose()


class SlowVerifyNodes(Nodes):
    """Nodes whose prefills are computed at once (``computed`` said) while each one's receiver
    verifies its KV only when the test says: ``verify[session]`` set; ``lost`` sessions' answers
    are then cut (the node died after ``computed``: no outcome)."""

    def __init__(self) -> None:
        super().__init__()
        self.verify: dict[str, asyncio.Event] = {}
        self.lost: set[str] = set()
        self.computing: dict[str, asyncio.Event] = {}
        """Sessions still computing until their event is set (the rest compute at once)."""

    async def prefill_streamed(
        self, ep: NodeEndpoint, cmd: PrefillCommand, computed: Callable[[], None]
    ) -> PrefillOutcome:
        self.commands.append((ep.node, cmd))
        if cmd.request_id in self.computing:
            await self.computing[cmd.request_id].wait()
        computed()
        await self.verify.setdefault(cmd.request_id, asyncio.Event()).wait()
        if cmd.request_id in self.lost:
            raise NodeCallFailed(
                ep.node, "unreachable", "the prefill stream ended before its outcome"
            )
        return PrefillOutcome(request_id=cmd.request_id, ok=True, kv_bytes_sent=7)


async def test_a_node_takes_its_next_prefill_while_the_last_ones_kv_is_verified() -> None:
    """The node is held while it computes, not while its tenant's receiver verifies: r2 is
    placed on the one node before r1's verification comes back; r1 stays running (its KV
    unsent, its outcome pending) until then, and is done when it comes."""
    nodes, clock = SlowVerifyNodes(), Clock()
    d = _driver(nodes, clock)
    for rid in ("r1", "r2", "r3"):
        _submit(d, clock, rid)
    d.tick()
    await _settle()
    assert "n0" not in d.busy  # r1 computed: the node is free again
    d.tick()
    await _settle()
    assert [c.request_id for _, c in nodes.commands] == ["s-r1", "s-r2"]  # before r1's verify
    for rid in ("r1", "r2"):
        assert d.door.outcome("a", rid).state == "running"  # type: ignore[union-attr]
    assert d.egress().backlog_of("a") == 20_000  # both KVs unsent until verified
    # The admission's running count follows the node: neither occupies it now.
    assert d.door.feedback("a", clock()).running == 0
    nodes.verify["s-r1"].set()
    await _settle()
    out: Any = d.door.outcome("a", "r1")
    assert (out.state, out.kv_bytes_sent) == ("done", 7)
    assert d.egress().backlog_of("a") == 10_000
    assert ("a", "r1") not in d.payloads
    await d.aclose()


async def test_a_failure_after_computed_still_fails_and_an_abort_frees_no_other() -> None:
    """r1's node said computed, then died before r1's outcome: r1 fails ``node_lost`` (the
    tenant prefills it locally), as before. r2, computed too, is aborted by its tenant: the
    abort goes to the node for r2's session, and does not free the node r3 now holds."""
    nodes, clock = SlowVerifyNodes(), Clock()
    nodes.computing["s-r3"] = asyncio.Event()
    d = _driver(nodes, clock)
    for rid in ("r1", "r2", "r3", "r4"):
        _submit(d, clock, rid)
    for _ in range(4):  # r1, r2 computed in turn on the one node; r3 computing there
        d.tick()
        await _settle()
    assert [c.request_id for _, c in nodes.commands] == ["s-r1", "s-r2", "s-r3"]
    nodes.lost.add("s-r1")
    nodes.verify["s-r1"].set()
    await _settle()
    out: Any = d.door.outcome("a", "r1")
    assert (out.state, out.reason) == ("failed", "node_lost")
    assert d.counters["a"]["failed"] == 1 and ("a", "r1") not in d.payloads
    assert d.abort("a", "r2")
    await _settle()
    assert nodes.aborted == [("n0", "s-r2")]
    assert d.busy["n0"] == ("a", "r3")  # r2's abort freed nothing r3 holds
    d.tick()
    await _settle()
    assert len(nodes.commands) == 3  # r4 waits for r3's compute
    out = d.door.outcome("a", "r2")
    assert (out.state, out.reason) == ("aborted", "client_gone")
    nodes.verify["s-r2"].set()  # r2's late answer changes nothing
    await _settle()
    assert d.door.outcome("a", "r2").state == "aborted"  # type: ignore[union-attr]
    nodes.computing["s-r3"].set()
    await _settle()
    d.tick()
    await _settle()
    assert [c.request_id for _, c in nodes.commands][-1] == "s-r4"
    await d.aclose()
