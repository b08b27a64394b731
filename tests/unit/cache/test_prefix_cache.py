"""The hybrid prefix cache: partial block matches, exact-length linear-state checkpoints, LRU
eviction from the tail, byte capacity, integrity; and the global KV manager's per-site view."""

from __future__ import annotations

import itertools
from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas.cache import GlobalKVManager, HybridPrefixCache, sizing_for
from prfaas.core.ids import SiteId
from prfaas.spec import get_model

HYBRID = sizing_for(get_model("paper-1t").cache)
DENSE = sizing_for(get_model("llama-3.1-70b").cache)


def test_sizing_from_cache_spec() -> None:
    spec = get_model("paper-1t").cache
    assert HYBRID.block_bytes == spec.full_attention_bytes_per_token * 512
    assert HYBRID.checkpoint_bytes == spec.fixed_bytes
    assert DENSE.checkpoint_bytes == 0


def test_hit_needs_blocks_and_a_checkpoint_at_that_length() -> None:
    c = HybridPrefixCache(HYBRID, 10**13, checkpoint_every_blocks=4)
    c.insert(list(range(10)), 10 * 512 + 100)  # checkpoints after blocks 4, 8 and 10
    assert c.cached_tokens(list(range(10))) == 10 * 512
    assert c.cached_tokens([0, 1, 2, 3, 4, 5, 6, 99]) == 4 * 512  # blocks match to 7, state at 4
    assert c.cached_tokens([0, 1, 2]) == 0  # blocks present, no state at length 3*512
    # One token must always be computed: a prompt exactly as long as the cache reuses less.
    assert c.lookup(list(range(10)), 10 * 512) == 8 * 512
    c.check_integrity()


def test_match_blocks_limit_cuts_the_match_wherever_it_falls() -> None:
    """The limit applies after the scan (no slice of the prompt first): the answer is the
    obvious one, the leading present blocks within the limit, walked back to a checkpoint."""
    for sizing in (HYBRID, DENSE):
        c = HybridPrefixCache(sizing, 10**13, checkpoint_every_blocks=3)
        c.insert(list(range(8)), 8 * 512)  # checkpoints after blocks 2, 5 and 8
        prompt = [*range(8), 99, 100]
        for max_tokens in (None, -1, 0, 511, 512, 3 * 512, 5 * 512 + 7, 8 * 512, 10**6):
            # (a negative limit, as ever, is none)
            limit = len(prompt) if max_tokens is None or max_tokens < 0 else max_tokens // 512
            want = 0
            while want < min(limit, len(prompt)) and prompt[want] in range(8):
                want += 1
            if sizing is HYBRID:
                while want and want not in (3, 6, 8):
                    want -= 1
            assert c.match_blocks(prompt, max_tokens) == want, (sizing, max_tokens)


def test_dense_model_matches_any_block_prefix() -> None:
    c = HybridPrefixCache(DENSE, 10**13)
    c.insert([1, 2, 3], 3 * 512)
    assert c.cached_tokens([1, 2, 7]) == 2 * 512
    c.check_integrity()


def test_lru_evicts_the_tail_of_old_prefixes_first() -> None:
    per = DENSE.block_bytes
    c = HybridPrefixCache(DENSE, 6 * per)
    c.insert([1, 2, 3, 4], 4 * 512)
    c.insert([10, 11, 12, 13], 4 * 512)  # over capacity by 2 blocks: prefix 1..4 loses 3, 4
    assert c.cached_tokens([1, 2, 3, 4]) == 2 * 512
    assert c.cached_tokens([10, 11, 12, 13]) == 4 * 512
    assert c.num_evictions == 2
    c.lookup([1, 2], 3 * 512)  # refresh: now 10..13's tail goes first
    c.insert([20], 512)
    assert c.cached_tokens([10, 11, 12, 13]) == 3 * 512
    c.check_integrity()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 12), st.booleans()), max_size=40))
def test_integrity_holds_under_any_sequence(ops: list[tuple[int, int, bool]]) -> None:
    c = HybridPrefixCache(HYBRID, 3 * HYBRID.checkpoint_bytes, checkpoint_every_blocks=3)
    for family, n, is_insert in ops:
        hashes = [family * 1000 + i for i in range(n)]
        if is_insert:
            c.insert(hashes, n * 512)
        else:
            got = c.lookup(hashes, n * 512 + 1)
            assert got % 512 == 0 and got <= n * 512
        c.check_integrity()


def test_kv_manager_reports_each_site() -> None:
    a, b = SiteId("a"), SiteId("b")
    kv = GlobalKVManager({a: HybridPrefixCache(DENSE, 10**12), b: HybridPrefixCache(DENSE, 10**12)})
    kv.store(a, [1, 2, 3], 3 * 512)
    kv.store(b, [1], 512)
    assert dict(kv.peek([1, 2, 3, 4], 4 * 512)) == {a: 3 * 512, b: 512}
    assert kv.use(a, [1, 2, 3, 4], 4 * 512) == 3 * 512
    # A peeked figure spares the re-match and must give what matching gives.
    peeked = kv.peek([1, 2, 9], 3 * 512)
    assert kv.use(b, [1, 2, 9], 3 * 512, peeked.get(b, 0)) == kv.use(b, [1, 2, 9], 3 * 512) == 512
    assert kv.cache(a).hit_rate == 0.75
    kv.check_integrity()


class _ReferenceLRU:
    """The cache's rules written the slow, obvious way: one ``OrderedDict`` in recency order,
    each touch a ``move_to_end``. The use-stamp cache must evict exactly as this does."""

    def __init__(self, capacity_bytes: int, every: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.every = every
        self.lru: OrderedDict[tuple[str, int], int] = OrderedDict()

    def _touch(self, key: tuple[str, int]) -> None:
        if key in self.lru:
            self.lru.move_to_end(key)
        else:
            self.lru[key] = HYBRID.block_bytes if key[0] == "block" else HYBRID.checkpoint_bytes

    def match(self, hashes: list[int], max_tokens: int) -> int:
        k = best = 0
        while k < min(len(hashes), max_tokens // 512) and ("block", hashes[k]) in self.lru:
            k += 1
            if ("ckpt", hashes[k - 1]) in self.lru:
                best = k
        return best

    def lookup(self, hashes: list[int], num_tokens: int) -> int:
        k = self.match(hashes, num_tokens - 1)
        for i in range(k - 1, -1, -1):
            self._touch(("block", hashes[i]))
            if ("ckpt", hashes[i]) in self.lru:
                self._touch(("ckpt", hashes[i]))
        return k * 512

    def insert(self, hashes: list[int], num_tokens: int) -> None:
        last = min(len(hashes), num_tokens // 512) - 1
        for i in range(last, -1, -1):
            if i == last or (i + 1) % self.every == 0:
                self._touch(("ckpt", hashes[i]))
            self._touch(("block", hashes[i]))
        while sum(self.lru.values()) > self.capacity_bytes:
            self.lru.popitem(last=False)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 12),
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(1, 9), st.booleans()),
        max_size=60,
    ),
)
def test_evicts_exactly_like_a_move_to_end_lru(
    capacity_ckpts: int, ops: list[tuple[int, int, int, bool]]
) -> None:
    capacity = capacity_ckpts * HYBRID.checkpoint_bytes
    c = HybridPrefixCache(HYBRID, capacity, checkpoint_every_blocks=3)
    ref = _ReferenceLRU(capacity, 3)
    for family, fork, n, is_insert in ops:
        # Prompts of one family share blocks up to ``fork``, then diverge (chained hashes).
        hashes = [family * 1000 + (i if i < fork else 100 * fork + i) for i in range(n)]
        if is_insert:
            c.insert(hashes, n * 512)
            ref.insert(hashes, n * 512)
        else:
            assert c.lookup(hashes, n * 512 + 1) == ref.lookup(hashes, n * 512 + 1)
        assert c.cached_tokens(hashes) == ref.match(hashes, 10**9) * 512
        assert c.used_bytes == sum(ref.lru.values())
        c.check_integrity()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 12),
    st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=80),
)
def test_deferred_lookups_evict_exactly_like_a_move_to_end_lru(
    capacity_ckpts: int, ops: list[tuple[int, bool]]
) -> None:
    # The simulator's pattern: a prompt's hashes (one object) are looked up at routing and
    # inserted when its prefill ends, other prompts' operations in between; a lookup's block
    # stamps wait for that insert (or for an eviction, or a check). No check between operations
    # here: it would apply every waiting lookup.
    prompts = [
        tuple(family * 1000 + (i if i < fork else 100 * fork + i) for i in range(n))
        for family, fork, n in itertools.product(range(2), (1, 3), (2, 4, 7, 9))
    ][:8]
    capacity = capacity_ckpts * HYBRID.checkpoint_bytes
    c = HybridPrefixCache(HYBRID, capacity, checkpoint_every_blocks=3)
    ref = _ReferenceLRU(capacity, 3)
    for which, is_insert in ops:
        hashes = prompts[which]
        n = len(hashes)
        if is_insert:
            c.insert(hashes, n * 512)
            ref.insert(list(hashes), n * 512)
        else:
            assert c.lookup(hashes, n * 512 + 1) == ref.lookup(list(hashes), n * 512 + 1)
        assert c.used_bytes == sum(ref.lru.values())
        assert all(c.cached_tokens(h) == ref.match(list(h), 10**9) * 512 for h in prompts)
    c.check_integrity()
    # The stamps, once applied, order the entries as the reference does.
    order = sorted([(s, ("block", h)) for h, s in c._blocks.items()]
                   + [(s, ("ckpt", h)) for h, s in c._ckpts.items()])  # fmt: skip
    assert [key for _, key in order] == list(ref.lru)
