"""``HybridPrefixCache``: one site's prefix cache for a hybrid-attention model.

Two kinds of entries share one byte budget and one LRU order:
- *blocks*: full-attention KV of one ``block_tokens``-token block, keyed by the block's chained hash
  (a hash that identifies the block and the whole prefix before it, like the Mooncake trace's
  ``hash_ids``). Blocks match partially: any run of leading blocks is reusable.
- *checkpoints*: the fixed-size state of the linear-attention (and sliding-window) layers as of the
  end of block ``i``, keyed by that block's hash. A linear state is reusable only at exactly the
  length it was taken at, so checkpoints exist only at block-aligned lengths.
A hit is the longest prefix of ``k`` blocks such that blocks ``0..k-1`` are present *and* a
checkpoint at block ``k-1`` exists (a model without bounded layers needs no checkpoint). Inserting a
prompt stores its full blocks and checkpoints every ``checkpoint_every_blocks`` blocks plus one at
its last full block (where the next turn of a conversation resumes).

LRU: a lookup refreshes the matched entries tail first, so the *head* of a prefix stays the most
recent and eviction eats prefixes from their tail (evicting a head block would strand its tail).
Pure: no I/O, no clock; ``check_integrity`` re-derives every counter for tests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from prfaas.spec.cache_spec import CacheSpec, LayerKind

# Entry keys are ints: ``hash * 2`` for a block, ``hash * 2 + 1`` for a checkpoint (no tuple
# allocation on the hot path; hashes are non-negative ints, as in the trace).
_BLOCK = 0
_CKPT = 1


@dataclass(frozen=True, slots=True)
class CacheSizing:
    block_tokens: int
    block_bytes: int
    """Full-attention KV of one block, all layers."""
    checkpoint_bytes: int
    """Linear states plus SWA windows of one request (0 for a pure full-attention model)."""


def sizing_for(cache: CacheSpec, block_tokens: int = 512) -> CacheSizing:
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
    block = cache.full_attention_bytes_per_token * block_tokens
    ckpt = 0
    for layer in cache.layers:
        if layer.kind is LayerKind.LINEAR:
            ckpt += layer.fixed_bytes
        elif layer.kind is LayerKind.SWA:
            assert layer.window_tokens is not None
            ckpt += layer.window_tokens * layer.bytes_per_token
    return CacheSizing(block_tokens, block, ckpt)


class HybridPrefixCache:
    def __init__(
        self, sizing: CacheSizing, capacity_bytes: int, checkpoint_every_blocks: int = 16
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"cache capacity must be >= 0 bytes, got {capacity_bytes}")
        if checkpoint_every_blocks <= 0:
            raise ValueError(f"checkpoint_every_blocks must be > 0, got {checkpoint_every_blocks}")
        self.sizing = sizing
        self.capacity_bytes = capacity_bytes
        self.checkpoint_every_blocks = checkpoint_every_blocks
        self._needs_ckpt = sizing.checkpoint_bytes > 0
        # entry key -> bytes, in LRU order (oldest first).
        self._lru: OrderedDict[int, int] = OrderedDict()
        self.used_bytes = 0
        self.num_evictions = 0
        self.num_lookups = 0
        self.num_hit_tokens = 0
        self.num_lookup_tokens = 0

    # -- queries -------------------------------------------------------------------------------
    def match_blocks(self, block_hashes: Sequence[int], max_tokens: int | None = None) -> int:
        """Number of leading blocks usable as a prefix (no LRU refresh, no statistics)."""
        limit = len(block_hashes)
        if max_tokens is not None:
            limit = min(limit, max_tokens // self.sizing.block_tokens)
        lru = self._lru
        if not self._needs_ckpt:
            k = 0
            while k < limit and block_hashes[k] * 2 in lru:
                k += 1
            return k
        k = 0
        best = 0
        while k < limit:
            key = block_hashes[k] * 2
            if key not in lru:
                break
            k += 1
            if key + 1 in lru:
                best = k
        return best

    def cached_tokens(self, block_hashes: Sequence[int], max_tokens: int | None = None) -> int:
        return self.match_blocks(block_hashes, max_tokens) * self.sizing.block_tokens

    def lookup(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> int:
        """Cached prefix tokens usable for a prompt (at least one token is always computed);
        refreshes the matched entries and counts the hit."""
        k = self.match_blocks(block_hashes, num_prompt_tokens - 1)
        self.num_lookups += 1
        self.num_lookup_tokens += num_prompt_tokens
        self.num_hit_tokens += k * self.sizing.block_tokens
        lru = self._lru
        move = lru.move_to_end
        ckpt = self._needs_ckpt
        for i in range(k - 1, -1, -1):
            key = block_hashes[i] * 2
            move(key)
            if ckpt and key + 1 in lru:
                move(key + 1)
        return k * self.sizing.block_tokens

    # -- updates -------------------------------------------------------------------------------
    def insert(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> None:
        """Store the full blocks of a prefilled prompt and its checkpoints (tail first, so the
        head ends up most recently used)."""
        num_full = min(len(block_hashes), num_prompt_tokens // self.sizing.block_tokens)
        if num_full == 0:
            return
        every = self.checkpoint_every_blocks
        lru = self._lru
        move = lru.move_to_end
        block_bytes = self.sizing.block_bytes
        ckpt_bytes = self.sizing.checkpoint_bytes
        added = 0
        if not self._needs_ckpt:
            for i in range(num_full - 1, -1, -1):
                key = block_hashes[i] * 2
                if key in lru:
                    move(key)
                else:
                    lru[key] = block_bytes
                    added += block_bytes
        else:
            last = num_full - 1
            for i in range(last, -1, -1):
                key = block_hashes[i] * 2
                if i == last or (i + 1) % every == 0:
                    if key + 1 in lru:
                        move(key + 1)
                    else:
                        lru[key + 1] = ckpt_bytes
                        added += ckpt_bytes
                if key in lru:
                    move(key)
                else:
                    lru[key] = block_bytes
                    added += block_bytes
        self.used_bytes += added
        if self.used_bytes > self.capacity_bytes:
            self._evict()

    def _evict(self) -> None:
        lru = self._lru
        while self.used_bytes > self.capacity_bytes and lru:
            _, num_bytes = lru.popitem(last=False)
            self.used_bytes -= num_bytes
            self.num_evictions += 1

    # -- checks --------------------------------------------------------------------------------
    @property
    def num_entries(self) -> int:
        return len(self._lru)

    @property
    def hit_rate(self) -> float:
        """Cached tokens over looked-up prompt tokens."""
        return self.num_hit_tokens / self.num_lookup_tokens if self.num_lookup_tokens else 0.0

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if a counter disagrees with the entries."""
        total = 0
        for key, num_bytes in self._lru.items():
            kind = key & 1
            expected = self.sizing.block_bytes if kind == _BLOCK else self.sizing.checkpoint_bytes
            if num_bytes != expected:
                raise AssertionError(f"entry of kind {kind} weighs {num_bytes}, not {expected}")
            total += num_bytes
        if total != self.used_bytes:
            raise AssertionError(f"used_bytes {self.used_bytes} != sum of entries {total}")
        if self.used_bytes > self.capacity_bytes:
            raise AssertionError(f"used {self.used_bytes} > capacity {self.capacity_bytes}")
        if not self._needs_ckpt and any(k & 1 == _CKPT for k in self._lru):
            raise AssertionError("checkpoint stored for a model without bounded layers")
