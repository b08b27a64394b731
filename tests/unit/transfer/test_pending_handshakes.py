"""``transfer.pending_handshakes``: the open room cuts its oldest for a newcomer; a returning peer's
connections (by the name in their HELLO) have a room a flood of anonymous ones cannot cut; a name
claimed without the key only churns that name's few slots; learnt names are bounded."""

from __future__ import annotations

import pytest

from prfaas.transfer.pending_handshakes import PendingHandshakes

pytestmark = pytest.mark.timeout(10)


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed: BaseException | None = None

    def close(self, exc: BaseException | None = None) -> None:
        self.closed = exc

    def __repr__(self) -> str:
        return self.name


def test_the_oldest_open_connection_is_cut_for_a_newcomer() -> None:
    pending: PendingHandshakes[Conn] = PendingHandshakes(max_open=3)
    conns = [Conn(f"c{i}") for i in range(5)]
    for c in conns:
        pending.admit(c)
    assert [c.closed is not None for c in conns] == [True, True, False, False, False]
    assert "open room" in str(conns[0].closed)
    assert len(pending) == 3 and pending.num_cut == 2 and conns[4] in pending


def test_a_returning_peer_is_not_cut_by_an_anonymous_flood() -> None:
    pending: PendingHandshakes[Conn] = PendingHandshakes(max_open=4, max_per_known_peer=2)
    first = Conn("pf0-first")
    pending.admit(first)
    pending.authenticated(first, "pf0")  # it proved the key once
    assert pending.knows("pf0") and len(pending) == 0
    fresh = Conn("pf0-fresh")
    pending.admit(fresh)
    pending.hello(fresh, "pf0")  # its HELLO names a peer seen before: its own room
    flood = [Conn(f"x{i}") for i in range(100)]
    for c in flood:
        pending.admit(c)
        pending.hello(c, "stranger")  # unknown names stay in the open room
    assert fresh.closed is None and fresh in pending
    assert sum(c.closed is None for c in flood) == 4


def test_a_claimed_name_only_churns_its_own_slots() -> None:
    pending: PendingHandshakes[Conn] = PendingHandshakes(max_open=4, max_per_known_peer=2)
    done = Conn("d")
    pending.admit(done)
    pending.authenticated(done, "pf0")
    liars = [Conn(f"liar{i}") for i in range(5)]
    for c in liars:
        pending.admit(c)
        pending.hello(c, "pf0")
    assert sum(c.closed is None for c in liars) == 2  # pf0's room holds two, the newest
    assert "'pf0'" in str(liars[0].closed)
    other = Conn("other")
    pending.admit(other)
    assert other.closed is None  # the open room was not touched
    assert len(pending) == 3
    pending.authenticated(liars[4], "pf0")  # (a real one finishing) leaves its room
    pending.discard(liars[3])
    assert len(pending) == 1


def test_known_names_are_bounded_and_only_learnt_by_authenticating() -> None:
    pending: PendingHandshakes[Conn] = PendingHandshakes(max_open=8, max_known_peers=2)
    for name in ("a", "b", "c"):
        c = Conn(name)
        pending.admit(c)
        pending.authenticated(c, name)
    assert not pending.knows("a") and pending.knows("b") and pending.knows("c")
    c = Conn("x")
    pending.admit(c)
    pending.hello(c, "never-authenticated")
    assert not pending.knows("never-authenticated")
    with pytest.raises(ValueError, match="max_open"):
        PendingHandshakes(max_open=0)
