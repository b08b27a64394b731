"""``CheckpointStore``: a store of prefix checkpoints in namespaces with byte quotas, LRU by bytes
(``docs/pool.md``, *Prefixes*). The rules of a live node process's store
(``serve/node/prefix_store.PrefixStore``, which adds its payloads' journal to the gateway) and of
the pool simulator's nodes (``sim/pool_sim.py``, whose payloads are sizes only): one
implementation, so the two cannot drift.

An entry is a checkpoint as of k blocks (a payload with ``num_tokens`` = k x ``block_tokens`` and
``num_bytes``: full-attention KV of those tokens and the linear/SWA state at exactly that
length), so a hit is reusable only at a block-aligned length, like the paper's hybrid cache. It
is keyed by the prompt's k-th block hash: block hashes are chained, so that one hash names the
whole k-block prefix. Checkpoints of one prompt overlap (each holds its whole prefix), unlike
``prefix_cache.HybridPrefixCache``'s shared blocks: that is what a node process keeps.

Namespaces: a PrfaaS pool's node keeps each tenant's entries in a namespace of its own, and a
lookup reads only its own namespace, so no tenant can hit another's entries. Each namespace has a
quota of bytes (``quotas``; ``prefix_quotas.namespace_quotas``); quotas are guarantees, not caps:
a tenant may fill room nobody else uses, and when the store is full an insert evicts, in this
order, its own least recently used entries while it is over its quota, else the least recently
used entries of a namespace over its quota that stays at or over it after the eviction (the one
furthest over first), else its own. So another tenant's inserts never take a tenant below its
quota. A deployment's store (``quotas`` None) is one namespace, ``""``, whose quota is the whole
store: always over quota when full, it evicts its own LRU entries.

``changes``: told of every entry stored and evicted, in order (the live store's
``cache.mirror.StoreJournal``; None: nobody listens, the simulator). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Payload(Protocol):
    """What the store reads of a checkpoint (the engine's ``CachedPrefix``, or ``Checkpoint``)."""

    @property
    def num_tokens(self) -> int: ...
    @property
    def num_bytes(self) -> int: ...


P = TypeVar("P", bound=Payload)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint known by its size only (the simulator's payload)."""

    num_tokens: int
    num_bytes: int


class ChangeLog(Protocol):
    """Who is told of the store's changes (``cache.mirror.StoreJournal``)."""

    def stored(self, block_hash: int, num_tokens: int) -> None: ...
    def evicted(self, block_hash: int) -> None: ...


@dataclass(frozen=True, slots=True)
class NamespaceUsage:
    """What one namespace holds (a pool node's heartbeat carries one per tenant)."""

    namespace: str
    num_entries: int
    num_tokens: int
    """Prompt tokens its entries cover, summed (a prompt's checkpoints overlap: an upper bound
    of the distinct prefix tokens held)."""
    used_bytes: int
    quota_bytes: int
    num_hit_tokens: int
    """Prefix tokens its lookups found, since the store started."""
    num_lookup_tokens: int
    """Prompt tokens its lookups asked about."""


@dataclass(slots=True)
class _Namespace(Generic[P]):
    entries: OrderedDict[int, P] = field(default_factory=OrderedDict)
    """Last block hash of the prefix -> its checkpoint; oldest use first."""
    used_bytes: int = 0
    num_hit_tokens: int = 0
    num_lookup_tokens: int = 0


class CheckpointStore(Generic[P]):
    def __init__(
        self,
        capacity_bytes: int,
        block_tokens: int,
        checkpoint_every_blocks: int = 1,
        quotas: Mapping[str, int] | None = None,
        changes: ChangeLog | None = None,
    ) -> None:
        """``quotas``: namespace -> bytes guaranteed to it (a pool node's tenants; a namespace
        not listed is guaranteed nothing); None: one namespace, ``""``, of the whole store."""
        if capacity_bytes < 0 or block_tokens <= 0:
            raise ValueError(
                f"need capacity >= 0 and block_tokens > 0, got {capacity_bytes}, {block_tokens}"
            )
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self.checkpoint_every_blocks = checkpoint_every_blocks
        self._quotas: dict[str, int] | None = None
        self.set_quotas(quotas)
        self._spaces: dict[str, _Namespace[P]] = {}
        self._changes = changes
        self.used_bytes = 0
        self.num_lookups = 0
        self.num_hit_tokens = 0
        self.num_lookup_tokens = 0

    def __len__(self) -> int:
        return sum(len(space.entries) for space in self._spaces.values())

    def set_quotas(self, quotas: Mapping[str, int] | None) -> None:
        """New quotas (a pool node's reload of its tenants). Nothing is evicted now: a namespace
        left over its quota loses entries first when room is needed."""
        if quotas is not None:
            bad = {ns: q for ns, q in quotas.items() if q < 0}
            if bad:
                raise ValueError(f"quotas must be >= 0 bytes, got {bad}")
        self._quotas = None if quotas is None else dict(quotas)

    def quota_bytes(self, namespace: str) -> int:
        if self._quotas is None:
            return self.capacity_bytes
        return self._quotas.get(namespace, 0)

    def entries(self) -> list[tuple[int, int]]:
        """(last block hash, tokens) of every entry, oldest use first within a namespace."""
        return [
            (h, p.num_tokens) for space in self._spaces.values() for h, p in space.entries.items()
        ]

    def usage(self) -> list[NamespaceUsage]:
        """What each namespace holds, by name (every one with a quota, even if empty)."""
        names = sorted(set(self._spaces) | set(self._quotas or ()))
        out: list[NamespaceUsage] = []
        for name in names:
            space = self._spaces.get(name) or _Namespace()
            out.append(
                NamespaceUsage(
                    name,
                    len(space.entries),
                    sum(p.num_tokens for p in space.entries.values()),
                    space.used_bytes,
                    self.quota_bytes(name),
                    space.num_hit_tokens,
                    space.num_lookup_tokens,
                )
            )
        return out

    def lookup(
        self,
        block_hashes: Sequence[int],
        num_prompt_tokens: int,
        at_most_tokens: int,
        namespace: str = "",
    ) -> P | None:
        """The longest prefix of this prompt stored in ``namespace``, at most ``at_most_tokens``
        and shorter than the prompt (a prefill computes at least one token)."""
        space = self._space(namespace)
        self.num_lookups += 1
        self.num_lookup_tokens += num_prompt_tokens
        space.num_lookup_tokens += num_prompt_tokens
        limit = min(at_most_tokens, num_prompt_tokens - 1) // self.block_tokens
        for k in range(min(limit, len(block_hashes)), 0, -1):
            key = block_hashes[k - 1]
            hit = space.entries.get(key)
            if hit is not None and hit.num_tokens == k * self.block_tokens:
                space.entries.move_to_end(key)
                self.num_hit_tokens += hit.num_tokens
                space.num_hit_tokens += hit.num_tokens
                return hit
        return None

    def cached_tokens(
        self, block_hashes: Sequence[int], num_prompt_tokens: int, namespace: str = ""
    ) -> int:
        """What ``lookup`` would find for this prompt, with no LRU refresh or statistics."""
        space = self._spaces.get(namespace)
        if space is None:
            return 0
        limit = (num_prompt_tokens - 1) // self.block_tokens
        for k in range(min(limit, len(block_hashes)), 0, -1):
            hit = space.entries.get(block_hashes[k - 1])
            if hit is not None and hit.num_tokens == k * self.block_tokens:
                return hit.num_tokens
        return 0

    def insert(
        self,
        block_hashes: Sequence[int],
        checkpoints: Sequence[P],
        namespace: str = "",
    ) -> list[tuple[int, int]]:
        """Keep the checkpoints every ``checkpoint_every_blocks`` blocks and at the last full
        block (where the next turn of a conversation resumes), in ``namespace``. Returns the
        (last block hash, tokens) entries stored that are still there after the eviction this
        insert caused."""
        space = self._space(namespace)
        changes = self._changes
        last = max((c.num_tokens // self.block_tokens for c in checkpoints), default=0)
        kept: list[int] = []
        for prefix in checkpoints:
            k = prefix.num_tokens // self.block_tokens
            if prefix.num_tokens % self.block_tokens or k > len(block_hashes) or k == 0:
                continue  # only block-aligned prefixes of known blocks are reusable
            if k % self.checkpoint_every_blocks and k != last:
                continue
            key = block_hashes[k - 1]
            old = space.entries.pop(key, None)
            if old is not None:
                self._took(space, -old.num_bytes)
            if prefix.num_bytes > self.capacity_bytes:
                if old is not None and changes is not None:
                    changes.evicted(key)
                continue
            space.entries[key] = prefix
            self._took(space, prefix.num_bytes)
            if changes is not None:
                changes.stored(key, prefix.num_tokens)
            kept.append(key)
        while self.used_bytes > self.capacity_bytes:
            victim = self._victim(namespace)
            key, evicted = victim.entries.popitem(last=False)
            self._took(victim, -evicted.num_bytes)
            if changes is not None:
                changes.evicted(key)
        return [(h, space.entries[h].num_tokens) for h in kept if h in space.entries]

    def _space(self, namespace: str) -> _Namespace[P]:
        # Not ``setdefault``: building a default per call costs more than the lookup itself.
        space = self._spaces.get(namespace)
        if space is None:
            space = self._spaces[namespace] = _Namespace()
        return space

    def _victim(self, namespace: str) -> _Namespace[P]:
        """Whose least recently used entry an insert into ``namespace`` evicts (the module's
        order): itself while over its quota; else the namespace furthest over its quota that
        stays at or over it; else itself. (A store over capacity always has entries: it held at
        most its capacity before the insert, so the inserting namespace holds some now.)"""
        own = self._spaces[namespace]
        if own.entries and own.used_bytes > self.quota_bytes(namespace):
            return own
        best: _Namespace[P] | None = None
        best_over = 0
        for name, space in self._spaces.items():
            if name == namespace or not space.entries:
                continue
            over = space.used_bytes - self.quota_bytes(name)
            lru = next(iter(space.entries.values()))
            if over >= lru.num_bytes and (best is None or over > best_over):
                best, best_over = space, over
        if best is not None:
            return best
        if own.entries:
            return own
        # Unreachable by the argument above; kept so that the capacity bound holds regardless.
        return max((s for s in self._spaces.values() if s.entries), key=lambda s: s.used_bytes)

    def _took(self, space: _Namespace[P], num_bytes: int) -> None:
        space.used_bytes += num_bytes
        self.used_bytes += num_bytes

    @property
    def hit_rate(self) -> float:
        """Hit tokens over looked-up prompt tokens."""
        return self.num_hit_tokens / self.num_lookup_tokens if self.num_lookup_tokens else 0.0
