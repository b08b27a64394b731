"""A site's store of prefix checkpoints: the payloads behind the hybrid prefix cache, and the one
truth about what a node of this process will find.

An entry is the engine's ``CachedPrefix`` as of k blocks (full-attention KV of those tokens and the
linear/SWA state at exactly that length), so a hit is reusable only at a block-aligned length, like
the paper's hybrid cache. It is keyed by the prompt's k-th block hash: block hashes are chained
(``serve/gateway/hashing.py``), so that one hash names the whole k-block prefix. LRU by bytes. One
store per worker process, shared by the process's nodes of one site.

Every insert and eviction goes into the store's ``StoreJournal`` (``cache/mirror.py``): the
process's heartbeats carry those changes to the gateway, whose ``KVMirror`` routes from them.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Sequence

from prfaas.cache.mirror import MAX_CHANGES_PER_REPORT, ReportAck, StoreJournal, StoreReport
from prfaas.engine import CachedPrefix


class PrefixStore:
    def __init__(
        self,
        capacity_bytes: int,
        block_tokens: int,
        checkpoint_every_blocks: int = 1,
        max_changes_per_report: int = MAX_CHANGES_PER_REPORT,
    ) -> None:
        if capacity_bytes < 0 or block_tokens <= 0:
            raise ValueError(
                f"need capacity >= 0 and block_tokens > 0, got {capacity_bytes}, {block_tokens}"
            )
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self.checkpoint_every_blocks = checkpoint_every_blocks
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()
        """Last block hash of the prefix -> its checkpoint; oldest use first."""
        self.used_bytes = 0
        self.num_lookups = 0
        self.num_hit_tokens = 0
        self.num_lookup_tokens = 0
        # A fresh epoch per store lifetime: a restarted process's sequence numbers start again,
        # and the gateway must not take them for ones it has applied.
        self.journal = StoreJournal(secrets.randbits(62), max_changes_per_report)
        self.journal.snapshot(())  # the gateway starts from an empty store

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[tuple[int, int]]:
        """(last block hash, tokens) of every entry, oldest use first."""
        return [(h, p.num_tokens) for h, p in self._entries.items()]

    def lookup(
        self, block_hashes: Sequence[int], num_prompt_tokens: int, at_most_tokens: int
    ) -> CachedPrefix | None:
        """The longest stored prefix of this prompt, at most ``at_most_tokens`` and shorter than
        the prompt (a prefill computes at least one token)."""
        self.num_lookups += 1
        self.num_lookup_tokens += num_prompt_tokens
        limit = min(at_most_tokens, num_prompt_tokens - 1) // self.block_tokens
        for k in range(min(limit, len(block_hashes)), 0, -1):
            key = block_hashes[k - 1]
            hit = self._entries.get(key)
            if hit is not None and hit.num_tokens == k * self.block_tokens:
                self._entries.move_to_end(key)
                self.num_hit_tokens += hit.num_tokens
                return hit
        return None

    def cached_tokens(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> int:
        """What ``lookup`` would find for this prompt, with no LRU refresh or statistics."""
        limit = (num_prompt_tokens - 1) // self.block_tokens
        for k in range(min(limit, len(block_hashes)), 0, -1):
            hit = self._entries.get(block_hashes[k - 1])
            if hit is not None and hit.num_tokens == k * self.block_tokens:
                return hit.num_tokens
        return 0

    def insert(
        self, block_hashes: Sequence[int], checkpoints: Sequence[CachedPrefix]
    ) -> list[tuple[int, int]]:
        """Keep the checkpoints every ``checkpoint_every_blocks`` blocks and at the last full
        block (where the next turn of a conversation resumes). Returns the (last block hash,
        tokens) entries stored that are still there after the eviction this insert caused."""
        last = max((c.num_tokens // self.block_tokens for c in checkpoints), default=0)
        kept: list[int] = []
        for prefix in checkpoints:
            k = prefix.num_tokens // self.block_tokens
            if prefix.num_tokens % self.block_tokens or k > len(block_hashes) or k == 0:
                continue  # only block-aligned prefixes of known blocks are reusable
            if k % self.checkpoint_every_blocks and k != last:
                continue
            key = block_hashes[k - 1]
            old = self._entries.pop(key, None)
            if old is not None:
                self.used_bytes -= old.num_bytes
            if prefix.num_bytes > self.capacity_bytes:
                if old is not None:
                    self.journal.evicted(key)
                continue
            self._entries[key] = prefix
            self.used_bytes += prefix.num_bytes
            self.journal.stored(key, prefix.num_tokens)
            kept.append(key)
        while self.used_bytes > self.capacity_bytes and self._entries:
            key, evicted = self._entries.popitem(last=False)
            self.used_bytes -= evicted.num_bytes
            self.journal.evicted(key)
        self._bound_journal()
        return [(h, self._entries[h].num_tokens) for h in kept if h in self._entries]

    # -- reports to the gateway -------------------------------------------------------------------
    def report(self) -> StoreReport:
        """The next changes for the gateway (none: it has them all; still sent, see
        ``StoreJournal.report``)."""
        return self.journal.report()

    def acknowledge(self, ack: ReportAck) -> None:
        """The gateway's answer to a report: forget what it applied; snapshot if it asks."""
        if self.journal.acknowledge(ack):
            self.snapshot()

    def snapshot(self) -> None:
        """Send the whole store next (a gateway that forgot it, or missed changes)."""
        self.journal.snapshot(self.entries())

    def _bound_journal(self) -> None:
        if self.journal.outgrown(len(self._entries)):
            self.snapshot()

    @property
    def seq(self) -> int:
        """The journal's sequence number after the last change (a prefill outcome carries it)."""
        return self.journal.seq

    @property
    def epoch(self) -> int:
        return self.journal.epoch

    @property
    def hit_rate(self) -> float:
        """Hit tokens over looked-up prompt tokens."""
        return self.num_hit_tokens / self.num_lookup_tokens if self.num_lookup_tokens else 0.0
