"""Per-tenant prefix namespaces and quotas at a pool node (``docs/pool.md``, *Prefixes*).

The store (``serve/node/prefix_store.py``): a tenant over its quota evicts its own least recently
used entries first; one under its quota evicts from a tenant over its quota, never taking it
below; a full store under one tenant's flood keeps the other's entries; a lookup reads its own
namespace only; a deployment's store (no quotas) is the one LRU it was. The chains
(``serve/node/prefix_namespaces.py``): the same tokens under two tenants share no hash and find
nothing of each other's; ``share_prefixes`` gives one unsalted chain. The pool file's shares (by
weight, or ``prefix_share``). The driver asks every node to look up and store, and tells each
tenant only its own namespace's figures (its feedback), the operator every tenant's
(``/metrics``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from pydantic import ValidationError

from prfaas.engine import CachedPrefix
from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.pool.app import TenantKeys, create_app
from prfaas.pool.client import Feedback
from prfaas.pool.driver import PlacementDriver
from prfaas.pool.frontdoor import FrontDoor, Receiver, Submit
from prfaas.pool.metrics import pool_registry
from prfaas.pool.payload import Payload
from prfaas.pool_sections import PoolFileConfig
from prfaas.serve.auth import signed_headers
from prfaas.serve.gateway.hashing import block_hashes
from prfaas.serve.node.messages import (
    Heartbeat,
    NodeEndpoint,
    PrefillCommand,
    PrefillOutcome,
    PrefixNamespaceMsg,
    Registration,
    SamplingMsg,
    pack_tokens,
)
from prfaas.serve.node.prefix_namespaces import PrefixNamespaces
from prfaas.serve.node.prefix_store import PrefixStore

pytestmark = pytest.mark.timeout(30)
BLOCK = 4
KEY = "p" * 32


@dataclass(frozen=True)
class _Prefix:
    """What the store reads of an engine's ``CachedPrefix``: its length and size."""

    num_tokens: int
    num_bytes: int


def _one(num_bytes: int) -> list[CachedPrefix]:
    """One checkpoint of one block weighing ``num_bytes``."""
    return cast(list[CachedPrefix], [_Prefix(BLOCK, num_bytes)])


def _put(store: PrefixStore, ns: str, key: int, num_bytes: int = 10) -> None:
    store.insert([key], _one(num_bytes), ns)


def _keys(store: PrefixStore, ns: str) -> set[int]:
    return {key for key in range(1000) if store.cached_tokens([key], BLOCK + 1, ns)}


def test_a_tenant_over_its_quota_evicts_its_own_oldest_first() -> None:
    store = PrefixStore(100, BLOCK, quotas={"a": 60, "b": 40})
    for key in (1, 2, 3):
        _put(store, "b", key)  # b: 30 of its 40
    for key in range(10, 17):
        _put(store, "a", key)  # a: 70, over its 60 while the store has room (100)
    assert store.used_bytes == 100
    _put(store, "a", 17)  # full: a is over its quota, so its own oldest goes
    assert _keys(store, "a") == set(range(11, 18)) and _keys(store, "b") == {1, 2, 3}
    store.lookup([11], BLOCK + 1, BLOCK, "a")  # a use makes 11 the newest
    _put(store, "a", 18)
    assert _keys(store, "a") == {11, *range(13, 19)}


def test_one_tenants_flood_of_a_full_store_keeps_the_others_within_its_quota() -> None:
    store = PrefixStore(100, BLOCK, quotas={"a": 60, "b": 40})
    for key in range(6):
        _put(store, "a", key)  # a at its quota, 60
    for key in range(100, 200):
        _put(store, "b", key)  # b floods: evicts only its own beyond 40
    assert _keys(store, "a") == set(range(6))
    assert len(_keys(store, "b")) == 4 and store.used_bytes == 100
    # b alone first filled the store far over its quota; a under its quota takes it back from b,
    # down to b's quota and no further.
    store = PrefixStore(100, BLOCK, quotas={"a": 60, "b": 40})
    for key in range(100, 110):
        _put(store, "b", key)  # b: 100, the whole store (no one else wanted it)
    for key in range(20):
        _put(store, "a", key)
    assert len(_keys(store, "b")) == 4 and _keys(store, "b") == set(range(106, 110))
    assert _keys(store, "a") == set(range(14, 20))  # then a evicts its own


def test_another_tenant_is_never_taken_below_its_quota() -> None:
    """b is 5 bytes over its quota, less than its oldest entry: a's insert, under a's quota,
    evicts a's own rather than take b below its quota."""
    store = PrefixStore(100, BLOCK, quotas={"a": 65, "b": 35})
    for key in range(4):
        _put(store, "b", key)  # b: 40, its quota 35
    for key in range(10, 22):
        _put(store, "a", key, num_bytes=5)  # a: 60 of 65, the store full
    _put(store, "a", 22, num_bytes=5)
    assert _keys(store, "b") == set(range(4))
    assert _keys(store, "a") == set(range(11, 23))


def test_a_deployments_store_is_one_lru_and_a_namespace_reads_only_its_own() -> None:
    store = PrefixStore(30, BLOCK)
    for key in (1, 2, 3):
        _put(store, "", key)
    store.lookup([1], BLOCK + 1, BLOCK)
    _put(store, "", 4)
    assert _keys(store, "") == {1, 3, 4} and store.quota_bytes("") == 30
    assert store.lookup([1], BLOCK + 1, BLOCK, "a") is None  # same key, another namespace


def _tokens() -> list[int]:
    return list(range(3 * BLOCK + 1))


def test_the_same_tokens_under_two_tenants_give_different_chains_and_no_hit() -> None:
    ns = PrefixNamespaces.from_internal_key(KEY, {"a": 0.5, "b": 0.5}, shared=False)
    a, b = ns.chain("a", _tokens(), BLOCK), ns.chain("b", _tokens(), BLOCK)
    assert len(a) == len(b) == 3 and not set(a) & set(b)
    assert not set(a) & set(block_hashes(_tokens(), BLOCK))  # not the unsalted chain either
    other_pool = PrefixNamespaces.from_internal_key("q" * 32, {"a": 1.0}, shared=False)
    assert other_pool.chain("a", _tokens(), BLOCK) != a  # the salt is the pool's secret
    store = PrefixStore(1000, BLOCK, quotas=ns.quotas(1000))
    store.insert(a, cast(list[CachedPrefix], [_Prefix(3 * BLOCK, 30)]), "a")
    assert store.cached_tokens(a, len(_tokens()), "a") == 3 * BLOCK
    assert store.lookup(b, len(_tokens()), 3 * BLOCK, "b") is None
    assert store.lookup(a, len(_tokens()), 3 * BLOCK, "b") is None  # even a's own hashes
    assert store.quota_bytes("a") == store.quota_bytes("b") == 500


def test_shared_prefixes_are_one_unsalted_chain_with_the_whole_store() -> None:
    ns = PrefixNamespaces.from_internal_key(KEY, {"a": 0.5, "b": 0.5}, shared=True)
    assert ns.chain("a", _tokens(), BLOCK) == ns.chain("b", _tokens(), BLOCK)
    assert ns.chain("a", _tokens(), BLOCK) == block_hashes(_tokens(), BLOCK)
    assert ns.namespace_of("a") == ns.namespace_of("b") == ""
    assert ns.quotas(1000) == {"": 1000}


def _pool(*tenants: tuple[str, float, dict[str, float]]) -> PoolFileConfig:
    return PoolFileConfig.model_validate(
        {
            "egress_gbps": 100,
            "groups": [{"name": "g", "model": "m", "num_nodes": 1}],
            "tenants": [
                {"name": n, "weight": w, "keys": [{"id": f"{n}-1", "env": "K"}], **extra}
                for n, w, extra in tenants
            ],
        }
    )


def test_shares_are_by_weight_unless_a_tenant_sets_one() -> None:
    by_weight = _pool(("a", 2, {}), ("b", 1, {}))
    assert by_weight.prefix_shares() == pytest.approx({"a": 2 / 3, "b": 1 / 3})
    told = _pool(("a", 2, {}), ("b", 1, {"prefix_share": 0.7}), ("c", 1, {}))
    assert told.prefix_shares() == pytest.approx({"a": 0.2, "b": 0.7, "c": 0.1})
    with pytest.raises(ValidationError, match=r"prefix_share sums to 1\.2"):
        _pool(("a", 1, {"prefix_share": 0.6}), ("b", 1, {"prefix_share": 0.6}))


class _Nodes:
    def __init__(self) -> None:
        self.commands: list[PrefillCommand] = []

    async def prefill(self, ep: NodeEndpoint, cmd: PrefillCommand) -> PrefillOutcome:
        self.commands.append(cmd)
        return PrefillOutcome(request_id=cmd.request_id, ok=True, num_cached_tokens=1024)

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


def _ns(name: str, entries: int, quota: int) -> PrefixNamespaceMsg:
    return PrefixNamespaceMsg(namespace=name, num_entries=entries, num_tokens=512 * entries,
                              used_bytes=100 * entries, quota_bytes=quota, hit_tokens=entries,
                              lookup_tokens=10)  # fmt: skip


async def test_the_driver_asks_for_prefixes_and_tells_a_tenant_only_its_own() -> None:
    shape = PoolShape((GroupShape("g", "m", 2),), 1e12, (TenantShare("a"), TenantShare("b")))
    door = FrontDoor(shape, epoch=5, lease_s=3.0, fingerprints={})
    nodes = _Nodes()
    d = PlacementDriver(door, {"n0": "g", "n1": "g"}, nodes, lambda: 100.0, wall=lambda: 100.0)  # type: ignore[arg-type]
    for process, node in (("p0", "n0"), ("p1", "n1")):
        ep = NodeEndpoint(node=node, site="g", role="prefill", host="127.0.0.1", http_port=1)
        d.register(Registration(process=process, nodes=[ep]))
    door.register("a", (Receiver("a-d0", "10.0.0.1", 9000),), 100.0)
    req = Submit("a", "r", "m", (), 2000, "a-d0", "s-r", 0.5, 1)
    assert door.submit("a", req, 100.0).status == 200
    d.accept(Payload("a", "r", "a-1", pack_tokens(range(2000)), SamplingMsg(max_new_tokens=1)))
    d.tick()
    for _ in range(5):
        await asyncio.sleep(0)
    (cmd,) = nodes.commands
    # The node hashes the prompt into the tenant's namespace itself: the command carries none.
    assert cmd.store_prefix and cmd.use_cached_tokens == 2000 and cmd.block_hashes == []
    out: Any = door.outcome("a", "r")
    assert (out.state, out.cached_tokens) == ("done", 1024)
    for process, a_entries, b_entries in (("p0", 2, 9), ("p1", 1, 5)):
        spaces = [_ns("a", a_entries, 600), _ns("b", b_entries, 300)]
        d.heartbeat(Heartbeat(process=process, reports=[], namespaces=spaces))
    (a,) = d.tenant_prefixes("a")
    assert (a.group, a.shared, a.num_entries, a.used_bytes, a.quota_bytes) == (
        ("g", False, 3, 300, 1200)
    )
    assert (a.hit_tokens, a.num_processes) == (3, 2)
    d.heartbeat(Heartbeat(process="p0", reports=[], namespaces=[_ns("", 7, 900)]))
    d.heartbeat(Heartbeat(process="p1", reports=[], namespaces=[]))
    (shared,) = d.tenant_prefixes("b")  # share_prefixes: the one namespace, marked so
    assert (shared.shared, shared.num_entries, shared.num_processes) == (True, 7, 1)


def test_a_tenant_reads_its_own_prefixes_and_the_operator_every_tenants() -> None:
    shape = PoolShape((GroupShape("g", "m", 1),), 1e9, (TenantShare("a"), TenantShare("b")))
    door = FrontDoor(shape, epoch=3, lease_s=30.0, fingerprints={})
    d = PlacementDriver(door, {"n0": "g"}, _Nodes(), lambda: 10.0, wall=lambda: 10.0)  # type: ignore[arg-type]
    ep = NodeEndpoint(node="n0", site="g", role="prefill", host="127.0.0.1", http_port=1)
    d.register(Registration(process="p0", nodes=[ep]))
    d.heartbeat(
        Heartbeat(process="p0", reports=[], namespaces=[_ns("a", 2, 600), _ns("b", 9, 300)])
    )
    keys = TenantKeys({"ka": ("a", b"a" * 32), "kb": ("b", b"b" * 32)})
    c = TestClient(create_app(door, keys, lambda m, n: (1.0, n), clock=lambda: 10.0,
                              prefixes=d.tenant_prefixes))  # fmt: skip
    for tenant, entries in (("a", 2), ("b", 9)):
        key = tenant.encode() * 32
        headers = signed_headers(key, "GET", "testserver", "/v1/feedback", b"", time.time(),
                                 key_id=f"k{tenant}")  # fmt: skip
        fb = Feedback.from_json(c.get("/v1/feedback", headers=headers).json())
        assert fb.prefixes is not None and len(fb.prefixes) == 1
        (mine,) = fb.prefixes
        assert (mine.group, mine.num_entries, mine.used_bytes) == ("g", entries, 100 * entries)
    scraped = generate_latest(pool_registry(d, lambda: 0)).decode()
    assert 'prfaas_pool_tenant_prefix_entries{group="g",tenant="a"} 2.0' in scraped
    assert 'prfaas_pool_tenant_prefix_quota_bytes{group="g",tenant="b"} 300.0' in scraped
    assert 'prfaas_pool_tenant_prefix_hit_tokens_total{group="g",tenant="b"} 9.0' in scraped


def test_the_live_store_and_rules_are_the_pool_simulators() -> None:
    """One implementation (``cache.checkpoint_store``, ``cache.prefix_quotas``): the live node's
    store extends the simulator's, and the namespaces' quotas are the simulator's rule."""
    from prfaas.cache.checkpoint_store import CheckpointStore
    from prfaas.cache.prefix_quotas import namespace_quotas, prefix_shares

    assert issubclass(PrefixStore, CheckpointStore)
    shares = prefix_shares([("a", 2.0, None), ("b", 1.0, None), ("c", 1.0, 0.25)])
    assert shares == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.25})
    for shared in (False, True):
        ns = PrefixNamespaces(b"k" * 32, shares, shared)
        assert ns.quotas(1000) == namespace_quotas(shares, shared, 1000)
