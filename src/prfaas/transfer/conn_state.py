"""A KV connection's states and its one transition table (``TRANSITIONS``).

``codec.Connection`` changes its ``ConnState`` only through this table: (role, state, direction,
frame type) -> next state. Anything absent is a protocol violation when received, a caller bug
when sent. Pure: imports only ``frames``.
"""

from __future__ import annotations

import enum

from prfaas.transfer import frames as F


class Role(enum.Enum):
    INITIATOR = "initiator"
    """Dials out; sends sessions (the KV sender)."""
    ACCEPTOR = "acceptor"
    """Listens; receives sessions (the KV receiver)."""


class ConnState(enum.Enum):
    AWAIT_HELLO = "await_hello"
    HELLO_SENT = "hello_sent"
    CHALLENGE_SENT = "challenge_sent"
    AUTH_SENT = "auth_sent"
    READY = "ready"
    CLOSED = "closed"
    """A connection-level ABORT was sent or received."""
    FAILED = "failed"
    """The peer violated the protocol; nothing more is read."""


class Dir(enum.Enum):
    SEND = "send"
    RECV = "recv"


_I, _A = Role.INITIATOR, Role.ACCEPTOR
_S, _R = Dir.SEND, Dir.RECV
_T = F.FrameType
_C = ConnState
# The one transition table: (role, state, direction, frame type) -> next state. Anything absent is
# a protocol violation (received) or a caller bug (sent). A connection-level ABORT (session 0)
# always leads to CLOSED and is handled before the table; session ABORTs keep the state.
TRANSITIONS: dict[tuple[Role, ConnState, Dir, F.FrameType], ConnState] = {
    (_I, _C.AWAIT_HELLO, _S, _T.HELLO): _C.HELLO_SENT,
    (_I, _C.HELLO_SENT, _R, _T.CHALLENGE): _C.AUTH_SENT,  # proof checked, AUTH queued
    (_I, _C.AUTH_SENT, _R, _T.READY): _C.READY,
    **{(_I, _C.READY, _S, t): _C.READY for t in (_T.OPEN, _T.CHUNK, _T.END, _T.ABORT)},
    **{(_I, _C.READY, _R, t): _C.READY for t in (_T.ACCEPT, _T.ACK, _T.COMPLETE, _T.ABORT)},
    (_A, _C.AWAIT_HELLO, _R, _T.HELLO): _C.CHALLENGE_SENT,  # CHALLENGE queued
    (_A, _C.CHALLENGE_SENT, _R, _T.AUTH): _C.READY,  # proof checked, READY queued
    **{(_A, _C.READY, _R, t): _C.READY for t in (_T.OPEN, _T.CHUNK, _T.END, _T.ABORT)},
    **{(_A, _C.READY, _S, t): _C.READY for t in (_T.ACCEPT, _T.ACK, _T.COMPLETE, _T.ABORT)},
}
