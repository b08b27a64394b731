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
Recency is a *use stamp* per entry (a counter value; larger is more recent) rather than a position
in an ``OrderedDict``: refreshing a prompt's blocks is then one dict store per block, where moving
each entry to the end took a ``move_to_end`` call per entry (the cache was a fifth of a
prefix-cached simulation). The stores are a plain loop: ``dict.update(zip(hashes, stamps))`` builds
a pair per block and measured a third slower over the few dozen blocks of a prompt. Eviction takes
the smallest stamps: it sorts a snapshot of the entries once and walks it, skipping entries
refreshed or evicted since (their stamp changed), and sorts again only when the walk runs out; the
order evicted is exactly that of a move-to-end LRU.
A lookup's block stamps are deferred: the simulator inserts the same prompt (the same hashes
object) when its prefill ends, which restamps every block the lookup matched, later; the insert
drops its lookup's record, and an eviction (or a check) first applies the records still waiting,
each block keeping the newer of its two stamps: the state any eviction sees is the eager one's.
The lookup's checkpoint stamps are written at once (an insert restamps only some checkpoints).
An eviction costs more than an ``OrderedDict.popitem`` (a Python step per entry walked): on the
Mooncake trace with a cache that evicts on most inserts the cache's own work is 5-15% slower (a
whole simulation: about even); with one that rarely evicts it is ~15% faster.
Pure: no I/O, no clock; ``check_integrity`` re-derives every counter for tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat

from prfaas.spec.cache_spec import CacheSpec, LayerKind


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


_MAX_PENDING = 4096
"""Deferred lookups a cache holds at most (the rest of their prompts' inserts never came, or not
yet): past this, all are applied."""


class HybridPrefixCache:
    def __init__(
        self, sizing: CacheSizing, capacity_bytes: int, checkpoint_every_blocks: int = 16
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"cache capacity must be >= 0 bytes, got {capacity_bytes}")
        if checkpoint_every_blocks <= 0:
            raise ValueError(f"checkpoint_every_blocks must be > 0, got {checkpoint_every_blocks}")
        self.sizing = sizing
        self._block_tokens = sizing.block_tokens  # read a few times per request
        self.capacity_bytes = capacity_bytes
        self.checkpoint_every_blocks = checkpoint_every_blocks
        self._needs_ckpt = sizing.checkpoint_bytes > 0
        self._blocks: dict[int, int] = {}
        """Block hash -> use stamp of the block's full-attention KV."""
        self._ckpts: dict[int, int] = {}
        """Block hash -> use stamp of the checkpoint taken at the end of that block."""
        self._clock = 0
        """The next use stamp (stamps only grow, so they order entries by recency)."""
        self._pending: dict[int, tuple[int, Sequence[int], int]] = {}
        """Lookups whose block stamps are deferred, by ``id`` of their hashes: ``(first stamp,
        hashes, number of blocks matched)``. The prompt's insert usually follows and restamps
        the same blocks (later): it drops its lookup's record, saving a dict write per matched
        block; anything that reads stamps (eviction, checks) applies the records first."""
        self._victims: Iterator[tuple[int, int, bool]] = iter(())
        """Eviction candidates, oldest first: the rest of a snapshot (stamp, block hash, is
        checkpoint) of the entries, taken when the previous one ran out."""
        self.used_bytes = 0
        self.num_evictions = 0
        self.num_lookups = 0
        self.num_hit_tokens = 0
        self.num_lookup_tokens = 0

    # -- queries -------------------------------------------------------------------------------
    def match_blocks(self, block_hashes: Sequence[int], max_tokens: int | None = None) -> int:
        """Number of leading blocks usable as a prefix (no LRU refresh, no statistics)."""
        blocks = self._blocks
        if not block_hashes or block_hashes[0] not in blocks:
            return 0  # most sites' answer for most prompts: nothing else to look at
        k = 0
        for block_hash in block_hashes:
            if block_hash not in blocks:
                break
            k += 1
        # The limit applied after the loop, not as a test per block (~7% slower) nor as a
        # slice of the prompt first: that copied the prompt's blocks on every call (a prompt's
        # limit, its length less one token, is almost always below its block count), where the
        # loop overruns the limit only when every block up to it is present (on a trace, by the
        # prompt's last, partial block). Replaying the Mooncake case's 24,062 peeks: 16% less.
        if max_tokens is not None and 0 <= max_tokens // self._block_tokens < k:
            k = max_tokens // self._block_tokens  # (a negative limit never stopped it: none)
        if self._needs_ckpt:
            ckpts = self._ckpts
            while k and block_hashes[k - 1] not in ckpts:
                k -= 1
        return k

    def may_extend(self, block_hashes: Sequence[int], num_tokens: int) -> bool:
        """Whether a prefix longer than ``num_tokens`` (a whole number of blocks) may be stored:
        the block after it is (one lookup; ``cached_tokens`` then says how long)."""
        k = num_tokens // self._block_tokens
        return k < len(block_hashes) and block_hashes[k] in self._blocks

    def cached_tokens(self, block_hashes: Sequence[int], max_tokens: int | None = None) -> int:
        return self.match_blocks(block_hashes, max_tokens) * self._block_tokens

    def lookup(
        self, block_hashes: Sequence[int], num_prompt_tokens: int, peeked_tokens: int | None = None
    ) -> int:
        """Cached prefix tokens usable for a prompt (at least one token is always computed);
        refreshes the matched entries and counts the hit.

        ``peeked_tokens``: what ``cached_tokens(block_hashes, num_prompt_tokens - 1)`` answered
        just before, with no update since (a driver peeks every site, routes, then looks up at
        the chosen one): spares matching the prompt a second time.
        """
        if peeked_tokens is None:
            k = self.match_blocks(block_hashes, num_prompt_tokens - 1)
        else:
            k = peeked_tokens // self._block_tokens
        self.num_lookups += 1
        self.num_lookup_tokens += num_prompt_tokens
        self.num_hit_tokens += k * self._block_tokens
        if k:
            # Tail first: block i, then its checkpoint, from i = k - 1 down to 0.
            base = self._clock
            self._clock += 2 * k
            if self._needs_ckpt:
                # A plain loop: finding the positions in C (``compress(count(), map(...))``)
                # measured 0.45 us slower at every prefix length up to 24 blocks (iterator set-up;
                # the same per block), and most lookups match a few blocks.
                ckpts = self._ckpts
                stamp = base + 1
                for block_hash in block_hashes[k - 1 :: -1]:
                    if block_hash in ckpts:
                        ckpts[block_hash] = stamp
                    stamp += 2
            # The blocks' stamps wait for the prompt's insert, which restamps them all.
            pending = self._pending
            key = id(block_hashes)  # unique while the record holds the sequence
            earlier = pending.get(key)
            if earlier is not None:  # the same prompt looked up again before its insert
                self._refresh(*earlier)
            pending[key] = (base, block_hashes, k)
            if len(pending) > _MAX_PENDING:
                self._apply_pending()
        return k * self._block_tokens

    def _refresh(self, base: int, block_hashes: Sequence[int], k: int) -> None:
        """Apply a lookup's deferred block stamps (``base``: its first) where no later operation
        stamped the block since: each block ends with the stamp of its last use, as if the
        lookup had stamped it when it ran. Its blocks are all still there (nothing is evicted
        while a lookup waits: ``_evict`` applies them first)."""
        blocks = self._blocks
        stamp = base
        for block_hash in block_hashes[k - 1 :: -1]:
            if blocks[block_hash] < stamp:
                blocks[block_hash] = stamp
            stamp += 2

    def _apply_pending(self) -> None:
        """Apply every deferred lookup (before anything reads the stamps)."""
        pending = self._pending
        for record in pending.values():
            self._refresh(*record)
        pending.clear()

    # -- updates -------------------------------------------------------------------------------
    def insert(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> None:
        """Store the full blocks of a prefilled prompt and its checkpoints (tail first, so the
        head ends up most recently used)."""
        num_full = min(len(block_hashes), num_prompt_tokens // self._block_tokens)
        if self._pending:
            looked_up = self._pending.pop(id(block_hashes), None)
            # This insert restamps (later) the blocks its lookup matched: the lookup's block
            # stamps would be overwritten, so they are dropped, unless it matched more.
            if looked_up is not None and looked_up[2] > num_full:
                self._refresh(*looked_up)
        if num_full == 0:
            return
        # Tail first: from i = last down to 0, block i's checkpoint (if it takes one), then block i.
        last = num_full - 1
        base = self._clock
        self._clock += 2 * num_full
        blocks = self._blocks
        num_before = len(blocks)
        stamp = base + 1
        for block_hash in block_hashes[last::-1]:  # a plain loop: see ``lookup``
            blocks[block_hash] = stamp
            stamp += 2
        added = (len(blocks) - num_before) * self.sizing.block_bytes
        if self._needs_ckpt:
            ckpts = self._ckpts
            num_before = len(ckpts)
            every = self.checkpoint_every_blocks
            ckpts[block_hashes[last]] = base
            # Then every ``every``-th block below it, downwards (a plain loop: no iterators).
            i = last - 1 - (last - every) % every if last >= every else -1
            while i >= 0:
                ckpts[block_hashes[i]] = base + 2 * (last - i)
                i -= every
            added += (len(ckpts) - num_before) * self.sizing.checkpoint_bytes
        self.used_bytes += added
        if self.used_bytes > self.capacity_bytes:
            self._evict()

    def _evict(self) -> None:
        """Drop the least recently used entries until the cache fits its capacity."""
        if self._pending:
            self._apply_pending()
        blocks, ckpts = self._blocks, self._ckpts
        block_bytes, ckpt_bytes = self.sizing.block_bytes, self.sizing.checkpoint_bytes
        used, capacity = self.used_bytes, self.capacity_bytes
        num_evicted = 0
        while used > capacity:
            for stamp, block_hash, is_ckpt in self._victims:
                # An entry refreshed or evicted since the snapshot has another stamp (or none):
                # it is newer than every entry still ahead in the snapshot, so it stays.
                table = ckpts if is_ckpt else blocks
                if table.get(block_hash) == stamp:
                    del table[block_hash]
                    used -= ckpt_bytes if is_ckpt else block_bytes
                    num_evicted += 1
                    if used <= capacity:
                        break
            else:
                self._victims = iter(self._snapshot())
        self.used_bytes = used
        self.num_evictions += num_evicted

    def _snapshot(self) -> list[tuple[int, int, bool]]:
        """Every entry as (stamp, block hash, is checkpoint), oldest first."""
        return sorted(
            chain(
                zip(self._blocks.values(), self._blocks, repeat(False)),
                zip(self._ckpts.values(), self._ckpts, repeat(True)),
            )
        )

    # -- checks --------------------------------------------------------------------------------
    @property
    def num_entries(self) -> int:
        return len(self._blocks) + len(self._ckpts)

    @property
    def hit_rate(self) -> float:
        """Cached tokens over looked-up prompt tokens."""
        return self.num_hit_tokens / self.num_lookup_tokens if self.num_lookup_tokens else 0.0

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if a counter disagrees with the entries (after applying
        the deferred lookups: what is checked is what the cache would evict by)."""
        self._apply_pending()
        total = (
            len(self._blocks) * self.sizing.block_bytes
            + len(self._ckpts) * self.sizing.checkpoint_bytes
        )
        if total != self.used_bytes:
            raise AssertionError(f"used_bytes {self.used_bytes} != sum of entries {total}")
        if self.used_bytes > self.capacity_bytes:
            raise AssertionError(f"used {self.used_bytes} > capacity {self.capacity_bytes}")
        if not self._needs_ckpt and self._ckpts:
            raise AssertionError("checkpoint stored for a model without bounded layers")
        stamps = [*self._blocks.values(), *self._ckpts.values()]
        if len(set(stamps)) != len(stamps):
            raise AssertionError("two entries share a use stamp: recency order is ambiguous")
        if stamps and not 0 <= min(stamps) <= max(stamps) < self._clock:
            raise AssertionError(f"use stamps outside [0, {self._clock})")
