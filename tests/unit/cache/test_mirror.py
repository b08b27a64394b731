"""The gateway's mirror of the nodes' prefix stores (``cache/mirror.py``): a store's journal of
changes, reports applied in order, resent changes skipped, gaps and unknown epochs healed by a
snapshot, bounded reports, pending entries from prefill outcomes, and the per-site peek. The
property test drives a store and its mirror through lost reports, lost acknowledgements, gateway
and store restarts, and checks that once the reports get through the mirror holds what the store
holds."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas.cache.mirror import (
    ChangeKind,
    KVMirror,
    ReportAck,
    StoreChange,
    StoreJournal,
    StoreMirror,
    StoreReport,
)
from prfaas.core.ids import SiteId

PD, REMOTE = SiteId("pd"), SiteId("remote")


class _Store:
    """A store reduced to what the mirror sees: an LRU dict of (last block hash -> tokens) with
    a capacity in entries, journaling like ``serve/node/prefix_store.py``."""

    def __init__(self, epoch: int, capacity: int, max_changes: int = 1024) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[int, int] = OrderedDict()
        self.journal = StoreJournal(epoch, max_changes)
        self.journal.snapshot(())

    def insert(self, block_hash: int, tokens: int) -> None:
        self.entries.pop(block_hash, None)
        self.entries[block_hash] = tokens
        self.journal.stored(block_hash, tokens)
        while len(self.entries) > self.capacity:
            evicted, _ = self.entries.popitem(last=False)
            self.journal.evicted(evicted)

    def acknowledge(self, ack: ReportAck) -> None:
        if self.journal.acknowledge(ack):
            self.journal.snapshot(self.entries.items())


def _sync(store: _Store, mirror: StoreMirror, rounds: int = 50) -> int:
    """Heartbeats until the store has nothing unacknowledged; returns how many it took."""
    for i in range(rounds):
        report = store.journal.report()
        ack = mirror.apply(report)
        store.acknowledge(ack)
        if not report.changes and not ack.snapshot:
            return i
    raise AssertionError(f"not in sync after {rounds} reports")


def test_reports_carry_stores_and_evictions() -> None:
    store, mirror = _Store(7, capacity=2), StoreMirror(PD)
    store.insert(11, 512)
    store.insert(12, 1024)
    _sync(store, mirror)
    assert mirror.entries == {11: 512, 12: 1024}
    store.insert(13, 512)  # evicts 11
    assert _sync(store, mirror) == 1
    assert mirror.entries == {12: 1024, 13: 512}
    assert len(store.journal) == 0 and store.journal.report().changes == ()


def test_a_lost_acknowledgement_resends_and_the_mirror_skips_what_it_applied() -> None:
    store, mirror = _Store(7, capacity=10), StoreMirror(PD)
    store.insert(1, 512)
    first = store.journal.report()
    assert first is not None
    mirror.apply(first)  # applied, but the answer never reaches the node
    store.insert(2, 512)
    again = store.journal.report()
    assert again is not None and again.first_seq == first.first_seq  # resent from the start
    ack = mirror.apply(again)
    assert ack.applied_seq == again.last_seq and not ack.snapshot
    assert mirror.entries == {1: 512, 2: 512}


def test_a_lost_report_is_a_gap_healed_by_a_snapshot() -> None:
    store, mirror = _Store(7, capacity=10), StoreMirror(PD)
    store.insert(1, 512)
    _sync(store, mirror)
    store.insert(2, 512)
    lost = store.journal.report()
    assert lost is not None
    # The node believes it was applied (say, a gateway answer from before a gateway restart).
    store.acknowledge(ReportAck(7, lost.last_seq))
    store.insert(3, 512)
    report = store.journal.report()
    assert report is not None
    ack = mirror.apply(report)
    assert ack.snapshot and mirror.num_snapshots_asked == 1
    assert mirror.entries == {1: 512}  # nothing applied past the gap
    store.acknowledge(ack)
    _sync(store, mirror)
    assert mirror.entries == {1: 512, 2: 512, 3: 512}


def test_a_restarted_store_is_mirrored_from_its_reset() -> None:
    mirror = StoreMirror(PD)
    old = _Store(1, capacity=10)
    old.insert(1, 512)
    _sync(old, mirror)
    new = _Store(2, capacity=10)  # the process restarted: new epoch, sequence numbers again
    new.insert(5, 1024)
    _sync(new, mirror)
    assert mirror.epoch == 2 and mirror.entries == {5: 1024}


def test_an_unknown_epoch_without_a_reset_asks_for_a_snapshot() -> None:
    store, mirror = _Store(3, capacity=10), StoreMirror(PD)
    store.insert(1, 512)
    report = store.journal.report()
    assert report is not None
    store.acknowledge(ReportAck(3, report.last_seq))  # applied by a gateway that then restarted
    store.insert(2, 512)
    report = store.journal.report()
    assert report is not None and report.changes[0].kind is ChangeKind.STORED
    assert mirror.apply(report).snapshot
    store.acknowledge(mirror.apply(report))
    _sync(store, mirror)
    assert mirror.entries == {1: 512, 2: 512}


def test_reports_are_bounded_and_say_what_is_left() -> None:
    store, mirror = _Store(7, capacity=100, max_changes=3), StoreMirror(PD)
    for h in range(10):
        store.insert(h + 1, 512)
    first = store.journal.report()
    assert first is not None and len(first.changes) == 3 and first.backlog == 8  # 1 reset + 10
    assert _sync(store, mirror) == 4
    assert mirror.entries == {h + 1: 512 for h in range(10)}


def test_the_journal_of_an_unanswered_store_stays_bounded() -> None:
    store = _Store(7, capacity=4, max_changes=8)
    for h in range(1000):
        store.insert(h + 1, 512)
        # What PrefixStore does after each insert when no acknowledgement comes.
        if len(store.journal) > 2 * (len(store.entries) + 1) + store.journal.max_changes:
            store.journal.snapshot(store.entries.items())
    assert len(store.journal) <= 2 * (4 + 1) + 8 + 2
    mirror = StoreMirror(PD)
    _sync(store, mirror)
    assert mirror.entries == dict(store.entries)


def test_cached_tokens_matches_a_stores_lookup() -> None:
    mirror = StoreMirror(PD)
    mirror.apply(
        StoreReport(
            1, 1, (StoreChange(ChangeKind.RESET), StoreChange(ChangeKind.STORED, 102, 1536))
        )
    )
    hashes = [100, 101, 102, 103]
    assert mirror.cached_tokens(hashes, 4 * 512 - 1, now_s=0.0) == 1536
    assert mirror.cached_tokens(hashes, 1535, now_s=0.0) == 0  # longer than allowed
    assert mirror.cached_tokens([100, 101, 999], 10_000, now_s=0.0) == 0  # another prefix


def test_a_pending_entry_lasts_until_the_reports_cover_its_insert() -> None:
    store, mirror = _Store(7, capacity=1), StoreMirror(PD)
    _sync(store, mirror)
    store.insert(50, 512)
    # The prefill's outcome says what it stored and the journal position after the insert.
    mirror.expect([(50, 512)], now_s=0.0, ttl_s=5.0, epoch=7, seq=store.journal.seq)
    assert mirror.cached_tokens([50], 1000, now_s=1.0) == 512 and mirror.num_pending == 1
    store.insert(51, 512)  # evicts 50 before the next heartbeat
    _sync(store, mirror)
    assert mirror.num_pending == 0
    assert mirror.cached_tokens([50], 1000, now_s=1.0) == 0  # the reports say it is gone


def test_a_pending_entry_expires() -> None:
    mirror = StoreMirror(PD)
    mirror.expect([(50, 512)], now_s=0.0, ttl_s=2.0, epoch=7, seq=40)
    assert mirror.cached_tokens([50], 1000, now_s=1.9) == 512
    assert mirror.cached_tokens([50], 1000, now_s=2.0) == 0
    mirror.expire(now_s=2.0)
    assert mirror.num_pending == 0


def test_a_pending_entry_without_a_sequence_number_waits_for_two_caught_up_reports() -> None:
    store, mirror = _Store(7, capacity=10), StoreMirror(PD)
    _sync(store, mirror)
    mirror.expect([(60, 1024)], now_s=0.0, ttl_s=100.0)  # a prefix move: no journal position
    store.insert(70, 512)  # some other change, reported before the move's insert was
    _sync(store, mirror)
    assert mirror.num_pending == 1
    store.insert(60, 1024)
    _sync(store, mirror)
    assert mirror.num_pending == 0 and mirror.cached_tokens([60], 2000, now_s=0.0) == 1024


def test_peek_is_the_best_store_of_each_site() -> None:
    kv = KVMirror([PD, REMOTE], pending_ttl_s=5.0)
    kv.track("pd-a", PD)
    kv.track("pd-b", PD)
    kv.track("remote", REMOTE)
    reset = StoreChange(ChangeKind.RESET)

    def stored(block_hash: int, tokens: int) -> tuple[StoreChange, ...]:
        return (reset, StoreChange(ChangeKind.STORED, block_hash, tokens))

    kv.apply("pd-a", StoreReport(1, 1, stored(1, 512)), now_s=0.0)
    kv.apply("pd-b", StoreReport(2, 1, stored(2, 1024)), now_s=0.0)
    hashes = (1, 2, 3)
    assert dict(kv.peek(hashes, 3 * 512 + 1, now_s=0.0)) == {PD: 1024}  # remote: no hit, omitted
    assert kv.cached_tokens("pd-a", hashes, 3 * 512 + 1, now_s=0.0) == 512
    assert kv.cached_tokens("remote", hashes, 3 * 512 + 1, now_s=0.0) == 0
    assert kv.cached_tokens("pd-b", hashes, 1024, now_s=0.0) == 0  # a prefill computes one token
    assert kv.apply("unknown", StoreReport(1, 1, (reset,)), now_s=0.0) is None
    kv.forget("pd-b")
    assert dict(kv.peek(hashes, 3 * 512 + 1, now_s=0.0)) == {PD: 512}
    with pytest.raises(ValueError, match="unknown site"):
        kv.track("x", SiteId("nowhere"))


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(1, 12), st.integers(1, 4)),
        st.tuples(
            st.sampled_from(
                ["beat", "lose_report", "lose_ack", "gateway_forgets", "gateway_restarts"]
            )
        ),
        st.tuples(st.just("store_restarts")),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, capacity=st.integers(1, 6), max_changes=st.integers(1, 5))
def test_once_reports_get_through_the_mirror_holds_what_the_store_holds(
    ops: list[tuple[object, ...]], capacity: int, max_changes: int
) -> None:
    epochs = iter(range(1, 10**6))
    store = _Store(next(epochs), capacity, max_changes)
    mirror = StoreMirror(PD)
    for op in ops:
        kind = op[0]
        if kind == "insert":
            store.insert(int(str(op[1])), 512 * int(str(op[2])))
        elif kind == "beat":
            store.acknowledge(mirror.apply(store.journal.report()))
        elif kind == "lose_report":
            store.journal.report()  # sent, never arrived: nothing changes on either side
        elif kind == "lose_ack":
            mirror.apply(store.journal.report())
        elif kind == "gateway_forgets":  # the process re-registers: a fresh mirror, a snapshot
            mirror = StoreMirror(PD)
            store.journal.snapshot(store.entries.items())
        elif kind == "gateway_restarts":  # a fresh mirror the node has not heard of yet
            mirror = StoreMirror(PD)
        else:  # a new process under the same name: an empty store, a new epoch
            store = _Store(next(epochs), capacity, max_changes)
        assert set(mirror.entries) <= set(range(1, 13))
    _sync(store, mirror, rounds=200)
    assert mirror.entries == dict(store.entries)
    for h in range(1, 13):
        want = store.entries.get(h, 0)
        assert mirror.cached_tokens([h], 10**6, now_s=0.0) == want


def test_a_fresh_mirror_learns_a_quiet_store_from_its_empty_report() -> None:
    """Found by the hypothesis test: after the gateway restarts, a store with nothing new to
    report still sends its epoch and position, so the new mirror asks for a snapshot instead of
    mirroring nothing until the store next changes."""
    store, mirror = _Store(7, capacity=4), StoreMirror(PD)
    store.insert(1, 512)
    _sync(store, mirror)
    fresh = StoreMirror(PD)
    ack = fresh.apply(store.journal.report())
    assert ack.snapshot
    store.acknowledge(ack)
    _sync(store, fresh)
    assert fresh.entries == {1: 512}
