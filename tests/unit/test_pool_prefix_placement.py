"""Cache-aware placement and charging at the pool's front door (``policy/pool_placement.py``,
``pool/prefix_hits.py``, ``FrontDoor.place``, ``PlacementDriver``; ``docs/pool.md``, *Prefixes*).

Two nodes of one group, each its own process; node B (``n1``) reports, in its store's journal,
tenant a's prefix of a prompt (the chain the door computes in a's namespace from the pool's
internal key). a's prefill of that prompt goes to B, not to the first free node, and is charged
only the compute of the tokens after the prefix; b's identical prompt finds nothing (another
salt, another chain) and goes to the first node, charged in full. A done prefill's stored
prefixes count before the journal does. Without hints, the door places and charges as before."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from prfaas.cache.mirror import ChangeKind, StoreChange, StoreReport
from prfaas.policy.pool_admission import EgressState, PrefillJob
from prfaas.policy.pool_placement import NodePick, prefer_cached, reusable_tokens
from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.pool.driver import PlacementDriver
from prfaas.pool.frontdoor import FrontDoor, Receiver, Submit
from prfaas.pool.payload import Payload
from prfaas.pool.prefix_hits import PrefixHits
from prfaas.serve.node.messages import (
    Heartbeat,
    NodeEndpoint,
    PrefillCommand,
    PrefillOutcome,
    PrefixReportMsg,
    Registration,
    SamplingMsg,
    pack_tokens,
)
from prfaas.serve.node.prefix_namespaces import PrefixNamespaces

pytestmark = pytest.mark.timeout(30)
KEY = "pool-internal-key-0123456789abcdef"
BLOCK = 512
PROMPT = [7] * 2048 + [8] * 52
"""2,100 tokens: a 2,048-token prefix (four blocks) and 52 more."""
PER_TOKEN_S = 0.001


def _compute_s(model: str, num_new: int, num_cached: int) -> float:
    return num_new * PER_TOKEN_S


class _Nodes:
    def __init__(
        self, stored: list[tuple[int, int]] | None = None, found: list[int] | None = None
    ) -> None:
        """``found``: what each prefill's node finds of its prompt, in order (the outcome's
        ``num_cached_tokens``; 0 past the list); ``error``: the next outcomes fail."""
        self.commands: list[tuple[str, PrefillCommand]] = []
        self.stored = stored or []
        self.found = list(found or [])
        self.error = ""

    async def prefill(self, ep: NodeEndpoint, cmd: PrefillCommand) -> PrefillOutcome:
        self.commands.append((ep.node, cmd))
        found = self.found.pop(0) if self.found else 0
        return PrefillOutcome(request_id=cmd.request_id, ok=not self.error, error=self.error,
                              num_cached_tokens=found, stored_prefixes=self.stored,
                              store_epoch=1, store_seq=99)  # fmt: skip

    async def prefill_streamed(
        self, ep: NodeEndpoint, cmd: PrefillCommand, computed: Callable[[], None]
    ) -> PrefillOutcome:
        outcome = await self.prefill(ep, cmd)
        computed()  # as a node says it before its outcome line
        return outcome

    async def abort(self, ep: NodeEndpoint, request_id: str) -> None:
        pass

    async def aclose(self) -> None:
        pass


def _salts() -> PrefixNamespaces:
    return PrefixNamespaces.from_internal_key(KEY, {"a": 0.5, "b": 0.5}, shared=False)


def _journal(entries: list[tuple[int, int]]) -> PrefixReportMsg:
    """A store's first report: a snapshot (RESET, then its entries)."""
    stored = tuple(StoreChange(ChangeKind.STORED, h, n) for h, n in entries)
    changes = (StoreChange(ChangeKind.RESET), *stored)
    return PrefixReportMsg.of(StoreReport(1, 1, changes, 0))


def _driver(nodes: _Nodes, b_holds_a_prefix: bool = True) -> PlacementDriver:
    shape = PoolShape((GroupShape("g", "m", 2),), 1e12, (TenantShare("a"), TenantShare("b")))
    door = FrontDoor(shape, epoch=5, lease_s=30.0, fingerprints={})
    hits = PrefixHits(_salts(), BLOCK, _compute_s)
    d = PlacementDriver(door, {"n0": "g", "n1": "g"}, nodes, lambda: 100.0, wall=lambda: 100.0,
                        prefix_hits=hits)  # type: ignore[arg-type]  # fmt: skip
    for process, node in (("p0", "n0"), ("p1", "n1")):
        ep = NodeEndpoint(node=node, site="g", role="prefill", host="127.0.0.1", http_port=1)
        d.register(Registration(process=process, nodes=[ep]))
    # Node B holds a's 2,048-token prefix of PROMPT (its last block's hash in a's chain).
    a_chain = _salts().chain("a", PROMPT, BLOCK)
    d.heartbeat(Heartbeat(process="p0", reports=[], prefix=_journal([])))
    held = [(a_chain[3], 2048)] if b_holds_a_prefix else []
    d.heartbeat(Heartbeat(process="p1", reports=[], prefix=_journal(held)))
    ack = d.take_prefix_ack("p1")
    assert ack is not None and (ack.epoch, ack.applied_seq, ack.snapshot) == (
        1,
        1 + len(held),
        False,
    )
    assert d.take_prefix_ack("p1") is None  # once
    for tenant in "ab":
        door.register(tenant, (Receiver(f"{tenant}-d0", "10.0.0.1", 9000),), 100.0)
    return d


def _submit(d: PlacementDriver, tenant: str, rid: str) -> None:
    submitted_s = len(PROMPT) * PER_TOKEN_S  # the tenant's home cache holds none of it
    req = Submit(tenant, rid, "m", (), len(PROMPT), f"{tenant}-d0", f"s-{rid}", submitted_s, 1000)
    assert d.door.submit(tenant, req, 100.0).status == 200
    d.accept(
        Payload(tenant, rid, f"{tenant}-1", pack_tokens(PROMPT), SamplingMsg(max_new_tokens=1))
    )


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("tenant", "node", "computed_tokens"),
    [("a", "n1", len(PROMPT) - 2048), ("b", "n0", len(PROMPT))],
)
async def test_a_prefill_goes_where_its_tenants_prefix_is_and_pays_the_rest(
    tenant: str, node: str, computed_tokens: int
) -> None:
    nodes = _Nodes(found=[len(PROMPT) - computed_tokens])  # the node finds what it holds
    d = _driver(nodes)
    _submit(d, tenant, "r")
    d.tick()
    await _settle()
    ((placed_on, cmd),) = nodes.commands
    assert (placed_on, cmd.tenant) == (node, tenant)  # a: B, not the first free node; b: no hit
    # Charged the compute its node does (2 nodes; the egress part is negligible here).
    charged = d.door.admission.counter_of(tenant)
    assert charged == pytest.approx(computed_tokens * PER_TOKEN_S / 2)


async def test_a_done_prefills_stored_prefix_counts_before_the_journal_says_it() -> None:
    a_chain = _salts().chain("a", PROMPT, BLOCK)
    nodes = _Nodes(stored=[(a_chain[3], 2048)], found=[0, 2048])
    d = _driver(nodes, b_holds_a_prefix=False)  # neither node holds anything
    _submit(d, "a", "r1")
    d.tick()
    await _settle()
    assert nodes.commands[0][0] == "n0"  # no hit anywhere: the first node
    _submit(d, "a", "r2")
    d.tick()
    await _settle()
    assert nodes.commands[1][0] == "n0"  # its first turn left the prefix there
    assert d.door.admission.counter_of("a") == pytest.approx(
        (len(PROMPT) + len(PROMPT) - 2048) * PER_TOKEN_S / 2
    )


def test_without_hints_the_door_places_and_charges_as_submitted() -> None:
    shape = PoolShape((GroupShape("g", "m", 2),), 1e12, (TenantShare("a"),))
    door = FrontDoor(shape, epoch=5, lease_s=30.0, fingerprints={})
    door.register("a", (Receiver("a-d0", "10.0.0.1", 9000),), 1.0)
    assert door.submit("a", Submit("a", "r", "m", (), 100, "a-d0", "s", 2.0, 1), 1.0).status == 200
    placed = door.place("g", "n0", 1.0, EgressState(), others=("n1",))
    assert placed is not None and (placed.node, placed.cached_tokens) == ("n0", 0)
    assert door.admission.counter_of("a") == pytest.approx(1.0)


def test_the_longest_hit_wins_and_ties_keep_the_callers_order() -> None:
    hits = {"n0": 0, "n1": 1024, "n2": 1024, "n3": 512}
    assert prefer_cached(("n0", "n1", "n2", "n3"), hits.__getitem__) == NodePick("n1", 1024)
    assert prefer_cached(("n0", "n3"), lambda n: 0) == NodePick("n0", 0)
    assert reusable_tokens(2048, 512) == 1536  # a prefill computes at least one token
    assert reusable_tokens(2049, 512) == 2048
    assert reusable_tokens(1, 512) == 0


@pytest.mark.parametrize(
    ("b_holds", "found", "charged_tokens", "real_tokens", "counted"),
    [
        (True, 2048, 52, 52, {}),  # found as expected: unchanged
        (True, 0, 52, len(PROMPT), {"surcharged": 1}),  # evicted since its report: less
        (False, 2048, len(PROMPT), 52, {"refunded": 1}),  # stored since its report: more
    ],
    ids=["as_expected", "found_less_surcharged", "found_more_refunded"],
)
async def test_a_done_prefills_charge_is_trued_up_to_what_its_node_found(
    b_holds: bool, found: int, charged_tokens: int, real_tokens: int, counted: dict[str, int]
) -> None:
    """The door charged a's start what its mirror of the nodes' stores expected (a heartbeat
    behind); the node's outcome says what it really found, and a's counter ends exactly at the
    compute of the prompt past that (2 nodes): the difference refunded or surcharged, counted
    per tenant on ``/metrics`` by direction."""
    from prometheus_client import generate_latest

    from prfaas.pool.metrics import pool_registry

    nodes = _Nodes(found=[found])
    d = _driver(nodes, b_holds_a_prefix=b_holds)
    _submit(d, "a", "r")
    d.tick()
    assert d.door.admission.counter_of("a") == pytest.approx(charged_tokens * PER_TOKEN_S / 2)
    await _settle()
    assert d.door.outcome("a", "r").state == "done"  # type: ignore[union-attr]
    assert d.door.admission.counter_of("a") == pytest.approx(real_tokens * PER_TOKEN_S / 2)
    assert {k: d.counters["a"][k] for k in ("refunded", "surcharged") if d.counters["a"][k]} == (
        counted
    )
    text = generate_latest(pool_registry(d, lambda: 0)).decode()
    for direction in ("refunded", "surcharged"):
        n = float(counted.get(direction, 0))
        line = f'prfaas_pool_tenant_charge_corrections_total{{direction="{direction}",tenant="a"}}'
        assert f"{line} {n}" in text


class _Hints:
    """Node n1 holds 512 of every prompt (its reports); a node computes what it did not find."""

    def hit_tokens(self, job: PrefillJob, node: str) -> int:
        return 512 if node == "n1" else 0

    def compute_s(self, job: PrefillJob, cached_tokens: int) -> float:
        return (job.num_uncached_tokens - cached_tokens) * PER_TOKEN_S


def _door_placed(rid: str = "r") -> FrontDoor:
    shape = PoolShape((GroupShape("g", "m", 2),), 1e12, (TenantShare("a"),))
    door = FrontDoor(shape, epoch=5, lease_s=30.0, fingerprints={})
    door.register("a", (Receiver("a-d0", "10.0.0.1", 9000),), 1.0)
    sub = Submit("a", rid, "m", (), 1000, "a-d0", "s", 1.0, 1)
    assert door.submit("a", sub, 1.0).status == 200
    placed = door.place("g", "n0", 1.0, EgressState(), others=("n1",), hints=_Hints())
    assert placed is not None and (placed.node, placed.cached_tokens) == ("n1", 512)
    assert door.admission.counter_of("a") == pytest.approx(488 * PER_TOKEN_S / 2)
    return door


def test_a_failed_or_handed_back_prefill_is_trued_up_never_or_once() -> None:
    """A failed prefill keeps its start's charge whatever its node found; a handed-back one is
    refunded its whole start (``requeue``), a late outcome of it corrects nothing, and its new
    start is trued up once, at its own done outcome; a repeated outcome changes nothing."""
    door = _door_placed()
    assert door.finished("a", "r", 2.0, error="node_lost", cached_tokens=0) == 0.0
    assert door.admission.counter_of("a") == pytest.approx(488 * PER_TOKEN_S / 2)
    door = _door_placed()
    out = door.requeue("a", "r", 2.0, "notice")
    assert out is not None and out.state == "queued"
    assert door.admission.counter_of("a") == pytest.approx(0.0)
    assert door.finished("a", "r", 2.5, cached_tokens=0) == 0.0  # not running: nothing held
    assert door.admission.counter_of("a") == pytest.approx(0.0)
    again = door.place("g", "n0", 3.0, EgressState(), others=("n1",), hints=_Hints())
    assert again is not None and again.node == "n1"
    delta = door.finished("a", "r", 4.0, cached_tokens=0)  # evicted: computed all 1,000
    assert delta == pytest.approx(512 * PER_TOKEN_S / 2)
    assert door.admission.counter_of("a") == pytest.approx(1000 * PER_TOKEN_S / 2)
    assert door.finished("a", "r", 5.0, cached_tokens=0) == 0.0
    assert door.admission.counter_of("a") == pytest.approx(1000 * PER_TOKEN_S / 2)
