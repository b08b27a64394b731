"""vLLM blocks (its KV cache events) into prfaas prefix entries (``BlockTranslator``): the prfaas
hashes equal ``serve/gateway/hashing.block_hashes`` of the prefix's tokens at equal and unequal
block sizes, a removed block in the middle takes every longer prefix with it (and a re-store
brings them back), ``AllBlocksCleared``, a second KV cache group, salted or offloaded blocks and
a lost-events clear report nothing, the memory stays within ``max_blocks``, and the journal fed
to the gateway's ``StoreMirror`` leaves the mirror equal to what vLLM would hit (a random walk
over stores and removals against a model of vLLM's cache)."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas.cache.mirror import StoreMirror
from prfaas.core.ids import SiteId
from prfaas.serve.gateway.hashing import block_hashes
from prfaas.serve.vllm.block_translator import BlockTranslator, chain, prfaas_key, token_bytes
from prfaas.serve.vllm.kv_event_codec import (
    AllBlocksCleared,
    BlockKey,
    BlockRemoved,
    BlockStored,
)


def vhash(parent: BlockKey | None, tokens: tuple[int, ...]) -> bytes:
    """A stand-in for vLLM's block hash: chained over the parent and the block's tokens."""
    return hashlib.sha256(repr((parent, tokens)).encode()).digest()


def chain_of(tokens: list[int], size: int) -> list[bytes]:
    """vLLM's hashes of the full blocks of ``tokens``."""
    out: list[bytes] = []
    parent: bytes | None = None
    for i in range(0, len(tokens) - size + 1, size):
        parent = vhash(parent, tuple(tokens[i : i + size]))
        out.append(parent)
    return out


def stored(tokens: list[int], size: int, first: int, last: int, **kw: object) -> BlockStored:
    """vLLM caching blocks ``first..last-1`` of a prompt (as ``cache_full_blocks`` does)."""
    hashes = chain_of(tokens, size)
    group = int(kw.get("group", 0))  # type: ignore[call-overload]
    plain = bool(kw.get("plain", True))
    return BlockStored(
        tuple(hashes[first:last]),
        hashes[first - 1] if first else None,
        tuple(tokens[first * size : last * size]),
        size,
        group,
        plain,
    )


def expected(tokens: list[int], bt: int, upto: int) -> list[tuple[int, int]]:
    """The prfaas entries of ``tokens[:upto]`` at every prfaas boundary."""
    hs = block_hashes(tokens[:upto], bt)
    return [(h, (k + 1) * bt) for k, h in enumerate(hs)]


PROMPT = [random.Random(7).randrange(32000) for _ in range(200)]


def test_chain_is_the_gateways_hashing() -> None:
    digest = b""
    ours = []
    for i in range(0, 96, 32):
        digest = chain(digest, token_bytes(PROMPT[i : i + 32]))
        ours.append(prfaas_key(digest))
    assert tuple(ours) == block_hashes(PROMPT[:96], 32)


@pytest.mark.parametrize(("vllm_size", "bt"), [(16, 16), (8, 32), (48, 32), (64, 32), (5, 16)])
def test_entries_at_every_common_boundary(vllm_size: int, bt: int) -> None:
    t = BlockTranslator(bt, epoch=1)
    n = len(PROMPT) // vllm_size
    # Stored in two events, as two chunks of a chunked prefill are.
    t.apply([stored(PROMPT, vllm_size, 0, n // 2), stored(PROMPT, vllm_size, n // 2, n)])
    want = {(h, k) for h, k in expected(PROMPT, bt, n * vllm_size) if k % vllm_size == 0}
    assert set(t.entries()) == want and want
    hs = block_hashes(PROMPT, bt)
    best = max(k for _, k in want)
    assert t.cached_tokens(hs, len(PROMPT)) == best
    assert t.cached_tokens(hs, best) < best  # a prefill computes at least one token


def test_a_removed_block_takes_every_longer_prefix_and_a_restore_brings_them_back() -> None:
    t = BlockTranslator(32, epoch=1)
    t.apply([stored(PROMPT, 16, 0, 12)])  # 192 tokens: entries at 32, 64, ..., 192
    assert sorted(k for _, k in t.entries()) == [32, 64, 96, 128, 160, 192]
    middle = chain_of(PROMPT, 16)[4]  # tokens 64..80
    t.apply([BlockRemoved((middle,), 0, True)])
    assert sorted(k for _, k in t.entries()) == [32, 64]
    hs = block_hashes(PROMPT, 32)
    assert t.cached_tokens(hs, len(PROMPT)) == 64
    t.apply([stored(PROMPT, 16, 4, 5)])  # recomputed: its cached successors count again
    assert sorted(k for _, k in t.entries()) == [32, 64, 96, 128, 160, 192]
    # The journal said so: stored x6, evicted x4, stored x4 after the first RESET.
    kinds = [c.kind.value for c in t.report().changes]
    assert kinds == ["reset"] + ["stored"] * 6 + ["evicted"] * 4 + ["stored"] * 4


def test_blocks_whose_chain_is_unknown_wait_for_it() -> None:
    t = BlockTranslator(32, epoch=1)
    t.apply([stored(PROMPT, 16, 2, 6)])  # the first two blocks never reported
    assert t.entries() == [] and t.stats().num_blocks == 4
    t.apply([stored(PROMPT, 16, 0, 2)])
    assert sorted(k for _, k in t.entries()) == [32, 64, 96]


def test_a_shared_prefix_is_one_entry_and_survives_one_branch() -> None:
    t = BlockTranslator(32, epoch=1)
    other = PROMPT[:64] + [1] * 64
    t.apply([stored(PROMPT, 32, 0, 4), stored(other, 32, 2, 4)])
    assert len(t.entries()) == 4 + 2
    t.apply([BlockRemoved((chain_of(other, 32)[2],), 0, True)])
    assert set(t.entries()) == set(expected(PROMPT, 32, 128))


def test_clears_groups_salts_and_tiers_report_nothing() -> None:
    t = BlockTranslator(32, epoch=1)
    t.apply([stored(PROMPT, 32, 0, 2)])
    t.apply([AllBlocksCleared()])
    assert t.entries() == []
    t.apply([stored(PROMPT, 32, 0, 2, plain=False)])  # salted, LoRA or an offload tier
    assert t.entries() == []
    t.apply([stored(PROMPT, 32, 0, 2), BlockRemoved((chain_of(PROMPT, 32)[0],), 0, False)])
    assert len(t.entries()) == 2  # a removal from an offload tier leaves vLLM's own copy
    t.clear()  # lost events
    assert t.entries() == [] and t.num_cleared == 1
    t.apply([stored(PROMPT, 32, 0, 2)])
    t.apply([stored(PROMPT, 32, 0, 2, group=1)])  # a second KV cache group: hits need both
    assert t.entries() == [] and "group 1" in t.disabled
    t.apply([stored(PROMPT, 32, 0, 2)])
    assert t.entries() == []


def test_memory_is_bounded_and_the_oldest_blocks_go_first() -> None:
    t = BlockTranslator(32, epoch=1, max_blocks=8)
    prompts = [[p] * 32 + PROMPT[:96] for p in range(5)]  # 4 blocks each, distinct chains
    for p in prompts:
        t.apply([stored(p, 32, 0, 4)])
        assert t.stats().num_blocks <= 8
    assert {k for _, k in t.entries()} == {32, 64, 96, 128}
    assert t.cached_tokens(block_hashes(prompts[-1], 32), 129) == 128
    assert t.cached_tokens(block_hashes(prompts[0], 32), 129) == 0


def test_the_journal_stays_bounded_without_acknowledgements() -> None:
    t = BlockTranslator(32, epoch=1, max_changes_per_report=16)
    for _ in range(50):
        t.apply([stored(PROMPT, 32, 0, 4)])
        t.apply([BlockRemoved((chain_of(PROMPT, 32)[0],), 0, True)])
    assert len(t.journal) <= 2 * (len(t.entries()) + 1) + 16 + 8


def test_a_new_lifetime_is_a_new_epoch_the_mirror_resets_to() -> None:
    mirror = StoreMirror(SiteId("pd"))
    old = BlockTranslator(32, epoch=1)
    old.apply([stored(PROMPT, 32, 0, 4)])
    old.acknowledge(mirror.apply(old.report()))
    assert len(mirror.entries) == 4
    new = BlockTranslator(32, epoch=2)  # the server restarted: its cache is empty
    ack = mirror.apply(new.report())
    assert mirror.entries == {} and ack.epoch == 2 and not ack.snapshot


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.sampled_from([(16, 32), (32, 32), (24, 32)]))
def test_the_mirror_equals_what_vllm_would_hit(rng: random.Random, sizes: tuple[int, int]) -> None:
    """A model of vLLM's cache (a set of block hashes, each block's prefix) under random
    stores (any run of a prompt's blocks, its parent given) and removals; after every event
    the gateway's mirror, fed the journal with acknowledgements lost now and then, holds
    exactly the prfaas entries of the cached prefixes whose every block is cached."""
    vsize, bt = sizes
    base = [rng.randrange(50) for _ in range(6 * bt)]
    prompts = [base[: rng.randrange(bt, 6 * bt)] + [rng.randrange(50) for _ in range(bt)]
               for _ in range(4)]  # fmt: skip
    cached: dict[bytes, tuple[bytes | None, list[int]]] = {}  # hash -> (parent, prefix tokens)
    t = BlockTranslator(bt, epoch=5, max_changes_per_report=7)
    mirror = StoreMirror(SiteId("pd"))
    for _ in range(40):
        roll = rng.random()
        if roll < 0.6 or not cached:
            p = rng.choice(prompts)
            hashes = chain_of(p, vsize)
            first = rng.randrange(len(hashes))
            last = rng.randrange(first + 1, len(hashes) + 1)
            t.apply([stored(p, vsize, first, last)])
            for i in range(first, last):
                cached[hashes[i]] = (hashes[i - 1] if i else None, p[: (i + 1) * vsize])
        elif roll < 0.97:
            key = rng.choice(sorted(cached))
            del cached[key]
            t.apply([BlockRemoved((key,), 0, True)])
        else:
            cached.clear()
            t.apply([AllBlocksCleared()])
        for _ in range(3):  # a few heartbeats; some acknowledgements lost
            ack = mirror.apply(t.report())
            if rng.random() < 0.8:
                t.acknowledge(ack)
        want: dict[int, int] = {}
        for key, (_, prefix) in cached.items():
            k = key
            whole = True
            while k is not None:
                if k not in cached:
                    whole = False
                    break
                k = cached[k][0]  # type: ignore[assignment]
            if whole and len(prefix) % bt == 0:
                want[block_hashes(prefix, bt)[-1]] = len(prefix)
        assert dict(t.entries()) == want
        while t.report().changes and t.report().backlog:  # drain the rest
            t.acknowledge(mirror.apply(t.report()))
        t.acknowledge(mirror.apply(t.report()))
        assert mirror.entries == want
