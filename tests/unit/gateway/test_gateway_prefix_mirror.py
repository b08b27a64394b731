"""The gateway routes from what the nodes' prefix stores report: a real ``PrefixStore`` heartbeats
its changes (through the wire messages) into the registry's ``KVMirror``, which then answers every
prompt as the store would, after evictions too; a registration starts the mirror afresh and a
silent process's mirror goes with it. The dispatcher's commands carry the mirror's figures: the
decode node's prefix from its own store, the prefill's ``receiver_cached_tokens`` the same, a
decode node that pinned something else is counted and the prefill told what was pinned; a
prefill's outcome is counted on until the reports cover it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

import pytest
from gateway_fakes import (
    BLOCK_TOKENS,
    FakeNodes,
    make_dispatcher,
    make_registry,
    register_all,
    report,
    request,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas.core import SiteId
from prfaas.engine import CachedPrefix
from prfaas.serve.gateway.hashing import block_hashes
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import Heartbeat, PrefixAckMsg, PrefixReportMsg
from prfaas.serve.node.prefix_store import PrefixStore

pytestmark = pytest.mark.timeout(60)
PD = SiteId("pd")


@dataclass(frozen=True)
class _Prefix:
    """What a store reads of an engine's ``CachedPrefix``: its length and size."""

    num_tokens: int
    num_bytes: int


def _checkpoints(num_tokens: int, bytes_per_block: int = 100) -> list[CachedPrefix]:
    """One checkpoint per full block, like an engine asked for them."""
    blocks = range(1, num_tokens // BLOCK_TOKENS + 1)
    return cast(
        list[CachedPrefix], [_Prefix(k * BLOCK_TOKENS, k * bytes_per_block) for k in blocks]
    )


def _beat(registry: NodeRegistry, process: str, store: PrefixStore, now_s: float) -> bool:
    """One heartbeat of the process, through the JSON both ends exchange; False if the store had
    nothing to report."""
    sent = store.report()
    if not sent.changes:
        return False
    beat = Heartbeat(process=process, reports=[report(process)], prefix=PrefixReportMsg.of(sent))
    assert registry.heartbeat(Heartbeat.model_validate_json(beat.model_dump_json()), now_s)
    ack = registry.take_prefix_ack(process)
    assert ack is not None
    store.acknowledge(PrefixAckMsg.model_validate(PrefixAckMsg.of(ack).model_dump()).to_ack())
    return True


def _sync(registry: NodeRegistry, process: str, store: PrefixStore, now_s: float = 0.0) -> None:
    for _ in range(100):
        if not _beat(registry, process, store, now_s):
            return
    raise AssertionError("the store never ran out of changes to report")


def _prompt(family: int, length_blocks: int, tail: int) -> list[int]:
    """Prompts of one family share their leading blocks; ``tail`` extra tokens (a partial block,
    never stored) make the prompt longer than its full blocks."""
    body = [family * 1000 + i for i in range(length_blocks * BLOCK_TOKENS)]
    return [*body, *range(1, tail + 2)]


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 6), st.integers(0, 2)), min_size=1, max_size=25
    ),
    capacity_blocks=st.integers(1, 30),
    max_changes=st.integers(1, 8),
)
def test_the_mirror_answers_every_prompt_as_the_store_does(
    prompts: list[tuple[int, int, int]], capacity_blocks: int, max_changes: int
) -> None:
    registry = make_registry()
    register_all(registry)
    store = PrefixStore(capacity_blocks * 100, BLOCK_TOKENS, 2, max_changes_per_report=max_changes)
    seen: list[list[int]] = []
    for i, (family, blocks, tail) in enumerate(prompts):
        tokens = _prompt(family, blocks, tail)
        seen.append(tokens)
        store.insert(block_hashes(tokens, BLOCK_TOKENS), _checkpoints(len(tokens)))
        if i % 3 == 0:  # heartbeats now and then, each bounded
            _beat(registry, "p0", store, now_s=0.0)
    _sync(registry, "p0", store)
    mirror = registry.kv.store("p0")
    assert mirror is not None and mirror.entries == dict(store.entries())
    for tokens in seen:
        hashes = block_hashes(tokens, BLOCK_TOKENS)
        want = store.cached_tokens(hashes, len(tokens))
        assert registry.kv.cached_tokens("p0", hashes, len(tokens), now_s=0.0) == want
        assert registry.kv.peek(hashes, len(tokens), now_s=0.0).get(PD, 0) == want


def test_registration_starts_the_mirror_afresh_and_a_silent_process_takes_it_along() -> None:
    registry = make_registry()
    register_all(registry)
    store = PrefixStore(10_000, BLOCK_TOKENS)
    tokens = _prompt(1, 3, 0)
    hashes = block_hashes(tokens, BLOCK_TOKENS)
    store.insert(hashes, _checkpoints(len(tokens)))
    _sync(registry, "p0", store)
    assert registry.kv.cached_tokens("p0", hashes, len(tokens), 0.0) == 3 * BLOCK_TOKENS
    register_all(registry, now_s=0.1)  # the gateway saw the processes register again
    assert registry.kv.cached_tokens("p0", hashes, len(tokens), 0.1) == 0
    store.snapshot()  # what a worker does once registered
    _sync(registry, "p0", store, now_s=0.1)
    assert registry.kv.cached_tokens("p0", hashes, len(tokens), 0.1) == 3 * BLOCK_TOKENS
    timeout = registry.deployment.gateway.heartbeat_timeout_s
    assert "p0" in registry.expire(now_wall_s=0.2 + timeout)
    assert registry.kv.store("p0") is None
    assert registry.kv.peek(hashes, len(tokens), 0.2 + timeout).get(PD, 0) == 0


def _stored_at(registry: NodeRegistry, process: str, tokens: list[int]) -> PrefixStore:
    store = PrefixStore(10_000, BLOCK_TOKENS)
    store.insert(block_hashes(tokens, BLOCK_TOKENS), _checkpoints(len(tokens)))
    _sync(registry, process, store)
    return store


def _mismatches(d: Any, side: str) -> float:
    value = d.metrics.registry.get_sample_value(
        "prfaas_prefix_mirror_mismatch_total", {"side": side}
    )
    return 0.0 if value is None else float(value)


async def test_the_decode_nodes_prefix_comes_from_its_own_stores_reports() -> None:
    nodes = FakeNodes()
    d, registry = make_dispatcher(nodes)
    req = request("r", 40)  # 2 full blocks of 16; the threshold router keeps it local
    _stored_at(registry, "d0", list(req.prompt_token_ids))
    _stored_at(registry, "d1", list(req.prompt_token_ids))
    events = [e async for e in d.generate(req)]
    assert events[-1].finish_reason == "length"
    (decode,) = nodes.decode_commands
    (prefill,) = nodes.prefill_commands
    assert decode.prefix_tokens == prefill.receiver_cached_tokens == 2 * BLOCK_TOKENS
    assert _mismatches(d, "decode") == 0


async def test_a_decode_node_that_pinned_less_is_counted_and_the_prefill_sends_the_rest() -> None:
    nodes = FakeNodes()
    d, registry = make_dispatcher(nodes)
    req = request("r", 40)
    for node in ("d0", "d1"):
        _stored_at(registry, node, list(req.prompt_token_ids))
        nodes.script(node).pinned_tokens = BLOCK_TOKENS  # evicted a block since its last report
    [e async for e in d.generate(req)]
    (decode,) = nodes.decode_commands
    (prefill,) = nodes.prefill_commands
    assert decode.prefix_tokens == 2 * BLOCK_TOKENS
    assert prefill.receiver_cached_tokens == BLOCK_TOKENS  # what the decode node really holds
    assert _mismatches(d, "decode") == 1


async def test_what_a_prefill_stored_is_seen_before_the_next_report() -> None:
    nodes = FakeNodes()
    d, registry = make_dispatcher(nodes)
    req = request("r", 40)
    hashes = block_hashes(req.prompt_token_ids, BLOCK_TOKENS)
    for node in ("p0", "p1"):
        nodes.script(node).stored_prefixes = [(hashes[1], 2 * BLOCK_TOKENS)]
    assert registry.kv.peek(hashes, 40, time.monotonic()) == {}
    [e async for e in d.generate(req)]
    (prefill,) = nodes.prefill_commands
    mirror = registry.kv.store(prefill.decode_node)  # the decode node's store has nothing...
    assert mirror is not None and mirror.num_pending == 0
    # ...the prefill node's has what its outcome said, until that process's reports cover it.
    assert registry.kv.peek(hashes, 40, time.monotonic()).get(PD) == 2 * BLOCK_TOKENS
    assert _mismatches(d, "prefill") == 0


async def test_an_engine_reusing_more_than_the_mirrors_blocks_is_no_mismatch() -> None:
    # vLLM reuses its own (finer) blocks: 36 tokens cached of which the mirror knows 32 is the
    # mirror being right at its granularity; reusing fewer blocks than it said is a mismatch.
    nodes = FakeNodes()
    d, registry = make_dispatcher(nodes)
    req = request("r", 40)
    for node in ("p0", "p1"):
        _stored_at(registry, node, list(req.prompt_token_ids))
        nodes.script(node).cached_tokens = 2 * BLOCK_TOKENS + 4
    [e async for e in d.generate(req)]
    assert _mismatches(d, "prefill") == 0
    for node in ("p0", "p1"):
        nodes.script(node).cached_tokens = BLOCK_TOKENS + 4
    [e async for e in d.generate(request("r2", 40))]
    assert _mismatches(d, "prefill") == 1


@pytest.mark.parametrize("pool", [False, True], ids=["prfaas_site", "pool"])
async def test_a_prefix_the_pool_found_is_logged_and_no_stale_mirror(
    pool: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An offload's outcome says what its PrfaaS node found: the route log and the site's hit
    rate count it. The gateway mirrors a PrfaaS site's store, so a hit it did not know of is a
    stale mirror; it mirrors no store of a pool's (the pool's front door places by them: the
    ``pool`` node, here the fakes' ``pf0`` under that name), so its hit is news, not a mismatch."""
    import prfaas.serve.gateway.relay as relay

    if pool:
        monkeypatch.setattr(relay, "POOL_NODE", "pf0")
        monkeypatch.setattr(relay, "POOL_SITE", "remote")
    nodes = FakeNodes()
    d, _ = make_dispatcher(nodes)
    nodes.script("pf0").cached_tokens = 4 * BLOCK_TOKENS
    [e async for e in d.generate(request("r", 100))]  # over the threshold: offloaded
    record = d.book.records[-1]
    assert (record.prefill_node, record.offloaded) == ("pf0", True)
    assert record.num_cached_tokens == 4 * BLOCK_TOKENS
    rate = d.metrics.registry.get_sample_value("prfaas_prefix_hit_rate", {"site": "remote"})
    assert rate == pytest.approx(4 * BLOCK_TOKENS / 100)
    assert _mismatches(d, "prefill") == (0 if pool else 1)
