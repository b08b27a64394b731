"""A site's store of prefix checkpoints: the payloads behind the hybrid prefix cache.

Keys are block-hash chains (the first k block hashes of a prompt); a value is the engine's
``CachedPrefix`` as of k blocks (full-attention KV of those tokens and the linear/SWA state at
exactly that length), so a hit is reusable only at a block-aligned length, like the paper's hybrid
cache. LRU by bytes. One store per worker process, shared by the process's nodes of one site.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from prfaas.engine import CachedPrefix


class PrefixStore:
    def __init__(
        self, capacity_bytes: int, block_tokens: int, checkpoint_every_blocks: int = 1
    ) -> None:
        if capacity_bytes < 0 or block_tokens <= 0:
            raise ValueError(
                f"need capacity >= 0 and block_tokens > 0, got {capacity_bytes}, {block_tokens}"
            )
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self.checkpoint_every_blocks = checkpoint_every_blocks
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self.used_bytes = 0
        self.num_lookups = 0
        self.num_hit_tokens = 0
        self.num_lookup_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self, block_hashes: Sequence[int], num_prompt_tokens: int, at_most_tokens: int
    ) -> CachedPrefix | None:
        """The longest stored prefix of this prompt, at most ``at_most_tokens`` and shorter than
        the prompt (a prefill computes at least one token)."""
        self.num_lookups += 1
        self.num_lookup_tokens += num_prompt_tokens
        limit = min(at_most_tokens, num_prompt_tokens - 1) // self.block_tokens
        for k in range(min(limit, len(block_hashes)), 0, -1):
            key = tuple(block_hashes[:k])
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.num_hit_tokens += hit.num_tokens
                return hit
        return None

    def insert(self, block_hashes: Sequence[int], checkpoints: Sequence[CachedPrefix]) -> None:
        """Keep the checkpoints every ``checkpoint_every_blocks`` blocks and at the last full
        block, like ``cache.HybridPrefixCache`` (the gateway's model of this store)."""
        last = max((c.num_tokens // self.block_tokens for c in checkpoints), default=0)
        for prefix in checkpoints:
            k = prefix.num_tokens // self.block_tokens
            if prefix.num_tokens % self.block_tokens or k > len(block_hashes) or k == 0:
                continue  # only block-aligned prefixes of known blocks are reusable
            if k % self.checkpoint_every_blocks and k != last:
                continue
            key = tuple(block_hashes[:k])
            old = self._entries.pop(key, None)
            if old is not None:
                self.used_bytes -= old.num_bytes
            if prefix.num_bytes > self.capacity_bytes:
                continue
            self._entries[key] = prefix
            self.used_bytes += prefix.num_bytes
        while self.used_bytes > self.capacity_bytes and self._entries:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= evicted.num_bytes

    @property
    def hit_rate(self) -> float:
        """Hit tokens over looked-up prompt tokens."""
        return self.num_hit_tokens / self.num_lookup_tokens if self.num_lookup_tokens else 0.0
