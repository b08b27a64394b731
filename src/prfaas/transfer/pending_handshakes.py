"""``PendingHandshakes``: a receiver's connections that have not authenticated yet, bounded so that
a flood of them cannot lock legitimate senders out.

Two rooms. The *open* room holds every new connection, at most ``max_open``; when one more arrives
the oldest is cut (not the newcomer: a legitimate sender sends its HELLO at once and finishes the
handshake in one round trip, long before it becomes the oldest, while a flood's connections sit
idle). The *known* room: a connection whose HELLO names a peer that authenticated here before
(its process name, ``Authenticated.peer_name``) moves out of the open room into a room of its own
name, at most ``max_per_known_peer`` per name (over it, that name's oldest is cut). A flood of
anonymous connections therefore never cuts a returning peer's handshake, and one claiming a known
name can only churn that name's own few slots. Names learnt are bounded (``max_known_peers``, the
oldest forgotten) and only an authenticated handshake teaches one. Every connection is still cut
by its handshake deadline (the channel's timer). No I/O, no asyncio; channels are closed through
their ``close``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

MAX_PER_KNOWN_PEER = 16
"""Handshakes at once of one returning peer (a link opens a few connections at a time)."""
MAX_KNOWN_PEERS = 1024


class _Closable(Protocol):
    def close(self, exc: BaseException | None = None) -> None: ...


C = TypeVar("C", bound=_Closable)


class PendingHandshakes(Generic[C]):
    def __init__(
        self,
        max_open: int,
        max_per_known_peer: int = MAX_PER_KNOWN_PEER,
        max_known_peers: int = MAX_KNOWN_PEERS,
    ) -> None:
        if min(max_open, max_per_known_peer, max_known_peers) < 1:
            raise ValueError(
                f"max_open={max_open}, max_per_known_peer={max_per_known_peer} and "
                f"max_known_peers={max_known_peers} must be >= 1"
            )
        self.max_open = max_open
        self.max_per_known_peer = max_per_known_peer
        self.max_known_peers = max_known_peers
        self._open: dict[C, None] = {}  # insertion order: oldest first
        self._known_rooms: dict[str, dict[C, None]] = {}
        self._room_of: dict[C, str] = {}
        self._known: dict[str, None] = {}  # peer names that authenticated, oldest first
        self.num_cut = 0
        """Pending connections cut to make room."""

    def __len__(self) -> int:
        return len(self._open) + len(self._room_of)

    def __iter__(self) -> Iterator[C]:
        yield from list(self._open)
        yield from list(self._room_of)

    def __contains__(self, ch: object) -> bool:
        return ch in self._open or ch in self._room_of

    def knows(self, name: str) -> bool:
        return name in self._known

    def admit(self, ch: C) -> None:
        """A new connection: into the open room (its oldest cut when full)."""
        self._open[ch] = None
        while len(self._open) > self.max_open:
            self._cut(next(iter(self._open)), "open")

    def hello(self, ch: C, name: str) -> None:
        """``ch``'s HELLO named ``name``: a known peer's connection moves to its own room."""
        if ch not in self._open or name not in self._known:
            return
        del self._open[ch]
        room = self._known_rooms.setdefault(name, {})
        room[ch] = None
        self._room_of[ch] = name
        while len(room) > self.max_per_known_peer:
            self._cut(next(iter(room)), f"known peer {name!r}")

    def authenticated(self, ch: C, name: str) -> None:
        """``ch`` proved the key as ``name``: no longer pending; ``name`` is known from now on."""
        self.discard(ch)
        if name:
            self._known.pop(name, None)
            self._known[name] = None
            while len(self._known) > self.max_known_peers:
                del self._known[next(iter(self._known))]

    def discard(self, ch: C) -> None:
        self._open.pop(ch, None)
        name = self._room_of.pop(ch, None)
        if name is not None:
            room = self._known_rooms.get(name, {})
            room.pop(ch, None)
            if not room:
                self._known_rooms.pop(name, None)

    def _cut(self, ch: C, room: str) -> None:
        self.discard(ch)
        self.num_cut += 1
        ch.close(ConnectionRefusedError(f"cut: the {room} room of pending handshakes is full"))
