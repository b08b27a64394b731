"""What the nodes' prefix stores hold, as they report it: the gateway's one truth for prefix hits.

A live site's prefix store (``serve/node/prefix_store.py``) is the truth: a prefill finds exactly
what its process's store holds. The store keeps a ``StoreJournal`` of its changes (a prefix
stored, a prefix evicted, a reset that starts a snapshot), each numbered by a sequence number
within the store's *epoch* (one per store lifetime); every heartbeat carries the oldest changes the
gateway has not acknowledged (at most ``max_changes`` of them: a bounded message, the rest next
time). The gateway's ``KVMirror`` keeps one ``StoreMirror`` per store, applies the changes in
order, skips those it has applied already (a lost acknowledgement makes the node resend them) and
asks for a snapshot when it notices a gap or an epoch it does not know (a restarted process, a
gateway that forgot the store). A snapshot is a ``RESET`` followed by one ``STORED`` per entry,
sent like any change, so it is bounded per heartbeat too and needs no second mechanism.

A stored prefix is named by the hash of its last block: block hashes are chained
(``serve/gateway/hashing.py``), so that hash names the whole prefix; ``num_tokens`` is where its
checkpoint was taken (a block-aligned length, the only length its linear state is reusable at).

Between a prefill and the report that covers it, the gateway keeps what the prefill's node said it
stored as a short-lived *pending* entry (``KVMirror.expect_stored``), dropped once the report stream
has reached the store's sequence number at that insert (then the reports say whether the entry is
still there) or after ``pending_ttl_s``: without it a follow-up request sent within a heartbeat
interval would be routed as if the prefix were not there.

The simulator does not use this module: its caches are real (``GlobalKVManager`` over
``HybridPrefixCache``), not mirrors of reports.

Pure: no I/O, no clock (``now_s`` is passed in), no asyncio. Imports ``core`` only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from prfaas.core.ids import SiteId

MAX_CHANGES_PER_REPORT = 1024
"""Changes one heartbeat carries at most (~60 KB of JSON); the rest go in the next ones."""


class ChangeKind(Enum):
    RESET = "reset"
    """Forget everything: the changes that follow are a snapshot of the store."""
    STORED = "stored"
    EVICTED = "evicted"


@dataclass(frozen=True, slots=True)
class StoreChange:
    kind: ChangeKind
    block_hash: int = 0
    """The last block hash of the prefix (chained: it names the whole prefix); 0 for RESET."""
    num_tokens: int = 0
    """STORED: the tokens the prefix covers (its checkpoint position); 0 otherwise."""


@dataclass(frozen=True, slots=True)
class StoreReport:
    """A run of a store's changes: ``changes[i]`` has sequence number ``first_seq + i``."""

    epoch: int
    first_seq: int
    changes: tuple[StoreChange, ...]
    backlog: int = 0
    """Changes after these that did not fit this report."""

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.changes) - 1


@dataclass(frozen=True, slots=True)
class ReportAck:
    """The gateway's answer to a report: everything up to ``applied_seq`` of ``epoch`` is applied;
    ``snapshot``: send a snapshot (it saw a gap or an epoch it does not know)."""

    epoch: int
    applied_seq: int
    snapshot: bool = False


class StoreJournal:
    """A store's changes not yet acknowledged by the gateway (the node side). The store calls
    ``stored`` / ``evicted`` as it changes and ``snapshot`` when asked or when the journal has
    grown longer than a snapshot would be (a gateway that does not answer must not make it grow
    without bound)."""

    def __init__(self, epoch: int, max_changes: int = MAX_CHANGES_PER_REPORT) -> None:
        if max_changes <= 0:
            raise ValueError(f"max_changes must be > 0, got {max_changes}")
        self.epoch = epoch
        self.max_changes = max_changes
        self.seq = 0
        """The last sequence number given to a change (0: none yet)."""
        self._unacked: deque[StoreChange] = deque()
        """Changes ``seq - len + 1 .. seq``, oldest first."""

    def __len__(self) -> int:
        return len(self._unacked)

    @property
    def first_unacked_seq(self) -> int:
        return self.seq - len(self._unacked) + 1

    def stored(self, block_hash: int, num_tokens: int) -> None:
        self._append(StoreChange(ChangeKind.STORED, block_hash, num_tokens))

    def evicted(self, block_hash: int) -> None:
        self._append(StoreChange(ChangeKind.EVICTED, block_hash))

    def snapshot(self, entries: Iterable[tuple[int, int]]) -> None:
        """Replace the unacknowledged changes with a RESET and one STORED per (block hash,
        tokens) entry: what came before the RESET no longer matters to anyone."""
        self._unacked.clear()
        self._append(StoreChange(ChangeKind.RESET))
        for block_hash, num_tokens in entries:
            self.stored(block_hash, num_tokens)

    def outgrown(self, num_entries: int) -> bool:
        """Longer than a snapshot of a store of ``num_entries`` (plus a report's worth): the
        store should snapshot instead, so a gateway that does not acknowledge cannot make the
        journal grow without bound."""
        return len(self._unacked) > 2 * (num_entries + 1) + self.max_changes

    def _append(self, change: StoreChange) -> None:
        self.seq += 1
        self._unacked.append(change)

    def report(self) -> StoreReport:
        """The oldest unacknowledged changes, at most ``max_changes``; with none, an empty report
        all the same: it carries the store's epoch and position, so a gateway that does not know
        them (it restarted, or forgot this process) asks for a snapshot instead of mirroring
        nothing until the store next changes (found by the hypothesis test below)."""
        sent = tuple(self._unacked[i] for i in range(min(self.max_changes, len(self._unacked))))
        return StoreReport(
            self.epoch, self.first_unacked_seq, sent, backlog=len(self._unacked) - len(sent)
        )

    def acknowledge(self, ack: ReportAck) -> bool:
        """Drop what the gateway applied; True when it asks for a snapshot (the caller takes one:
        only the store knows its entries)."""
        if ack.epoch == self.epoch:
            while self._unacked and self.first_unacked_seq <= ack.applied_seq:
                self._unacked.popleft()
        return ack.snapshot


@dataclass(slots=True)
class _Pending:
    num_tokens: int
    until_seq: int | None
    """Dropped once the reports reach this sequence number of ``epoch`` (None: unknown)."""
    epoch: int
    until_caught_up: int
    """With no sequence number: dropped after this many caught-up reports (see ``StoreMirror``)."""
    expires_s: float


class StoreMirror:
    """One store's entries as its reports say, plus pending entries from prefill outcomes."""

    def __init__(self, site_id: SiteId) -> None:
        self.site_id = site_id
        self.epoch: int | None = None
        """None until a report starting with RESET arrives (the first snapshot)."""
        self.applied_seq = 0
        self.entries: dict[int, int] = {}
        """Last block hash of a stored prefix -> the tokens it covers."""
        self._pending: dict[int, _Pending] = {}
        self.num_caught_up = 0
        """Reports applied that left no backlog. The node sends one heartbeat at a time, so the
        second such report after a moment was built after that moment."""
        self.num_snapshots_asked = 0

    # -- reports ----------------------------------------------------------------------------------
    def apply(self, report: StoreReport) -> ReportAck:
        changes = report.changes
        start = 0
        if report.epoch != self.epoch or report.first_seq > self.applied_seq + 1:
            # Another store lifetime or missed changes: only a RESET in the report can heal it.
            resets = [i for i, c in enumerate(changes) if c.kind is ChangeKind.RESET]
            if not resets:
                self.num_snapshots_asked += 1
                epoch = self.epoch if self.epoch is not None else report.epoch
                return ReportAck(epoch, self.applied_seq, snapshot=True)
            start = resets[-1]
            self.epoch = report.epoch
            self.applied_seq = report.first_seq + start - 1
        for i in range(start, len(changes)):
            seq = report.first_seq + i
            if seq <= self.applied_seq:
                continue  # sent again because our acknowledgement was lost
            change = changes[i]
            if change.kind is ChangeKind.RESET:
                self.entries.clear()
            elif change.kind is ChangeKind.STORED:
                self.entries[change.block_hash] = change.num_tokens
            else:
                self.entries.pop(change.block_hash, None)
            self.applied_seq = seq
        if report.backlog == 0 and changes:  # an empty report (nothing new) is no news
            self.num_caught_up += 1
        self._drop_covered()
        assert self.epoch is not None
        return ReportAck(self.epoch, self.applied_seq)

    def _drop_covered(self) -> None:
        """Pending entries the reports now speak for (stored, or stored and evicted since)."""
        for h in [h for h, p in self._pending.items() if self._covers(p)]:
            del self._pending[h]

    def _covers(self, p: _Pending) -> bool:
        if p.until_seq is None:
            return self.num_caught_up >= p.until_caught_up
        return p.epoch == self.epoch and self.applied_seq >= p.until_seq

    # -- pending entries --------------------------------------------------------------------------
    def expect(
        self,
        stored: Iterable[tuple[int, int]],
        now_s: float,
        ttl_s: float,
        epoch: int | None = None,
        seq: int | None = None,
    ) -> None:
        """The node said it stored these (block hash, tokens) prefixes, as of sequence number
        ``seq`` of ``epoch`` when it says (a prefill's outcome), else just now (a prefix move)."""
        for block_hash, num_tokens in stored:
            if seq is not None and epoch == self.epoch and self.applied_seq >= seq:
                continue  # the reports already cover it
            self._pending[block_hash] = _Pending(
                num_tokens,
                seq if epoch is not None else None,
                epoch if epoch is not None else 0,
                self.num_caught_up + 2,
                now_s + ttl_s,
            )

    def expire(self, now_s: float) -> None:
        for h in [h for h, p in self._pending.items() if p.expires_s <= now_s]:
            del self._pending[h]

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    # -- queries ----------------------------------------------------------------------------------
    def cached_tokens(self, block_hashes: Sequence[int], max_tokens: int, now_s: float) -> int:
        """The longest prefix of these blocks the store holds, at most ``max_tokens`` (what the
        store's own ``lookup`` would find)."""
        entries, pending = self.entries, self._pending
        for k in range(len(block_hashes), 0, -1):
            block_hash = block_hashes[k - 1]
            tokens = entries.get(block_hash)
            if tokens is None:
                p = pending.get(block_hash)
                if p is not None and p.expires_s > now_s:
                    tokens = p.num_tokens
            if tokens is not None and tokens <= max_tokens:
                return tokens
        return 0


class KVMirror:
    """Every reporting store of every site. A site's figure for the router is the best of its
    stores (``timed`` sites run one process, so one store; a ``torch`` node runs in its own)."""

    def __init__(self, site_ids: Sequence[SiteId], pending_ttl_s: float) -> None:
        self._site_ids = tuple(site_ids)
        self.pending_ttl_s = pending_ttl_s
        self._stores: dict[str, StoreMirror] = {}

    @property
    def site_ids(self) -> tuple[SiteId, ...]:
        return self._site_ids

    def track(self, store_id: str, site_id: SiteId) -> None:
        """A store (re)joined: mirror it from scratch (its first report with a RESET fills it)."""
        if site_id not in self._site_ids:
            raise ValueError(f"store {store_id} is at unknown site {site_id}")
        self._stores[store_id] = StoreMirror(site_id)

    def forget(self, store_id: str) -> None:
        self._stores.pop(store_id, None)

    def store(self, store_id: str) -> StoreMirror | None:
        return self._stores.get(store_id)

    def stores(self) -> Mapping[str, StoreMirror]:
        return MappingProxyType(self._stores)

    def apply(self, store_id: str, report: StoreReport, now_s: float) -> ReportAck | None:
        """None when the store is not tracked (its process must register first)."""
        mirror = self._stores.get(store_id)
        if mirror is None:
            return None
        mirror.expire(now_s)
        return mirror.apply(report)

    def expect_stored(
        self,
        store_id: str,
        stored: Iterable[tuple[int, int]],
        now_s: float,
        epoch: int | None = None,
        seq: int | None = None,
    ) -> None:
        mirror = self._stores.get(store_id)
        if mirror is not None:
            mirror.expect(stored, now_s, self.pending_ttl_s, epoch, seq)

    def cached_tokens(
        self, store_id: str, block_hashes: Sequence[int], num_prompt_tokens: int, now_s: float
    ) -> int:
        """What a node of this store will find for a prompt (a prefill computes at least one
        token); 0 for a store that has not reported."""
        mirror = self._stores.get(store_id)
        if mirror is None or not block_hashes:
            return 0
        return mirror.cached_tokens(block_hashes, num_prompt_tokens - 1, now_s)

    def peek(
        self, block_hashes: Sequence[int], num_prompt_tokens: int, now_s: float
    ) -> Mapping[SiteId, int]:
        """Cached prefix tokens per site (sites with no hit omitted), the router's
        ``RequestView.cached_prefix_tokens``."""
        if not block_hashes:
            return MappingProxyType({})
        out: dict[SiteId, int] = {}
        for mirror in self._stores.values():
            k = mirror.cached_tokens(block_hashes, num_prompt_tokens - 1, now_s)
            if k > out.get(mirror.site_id, 0):
                out[mirror.site_id] = k
        return MappingProxyType(out)
