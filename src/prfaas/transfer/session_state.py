"""``SessionState``: the life of one transfer session, at either end, and its one transition table.

Sender:   OPENING (OPEN sent) -> STREAMING (ACCEPTed) -> ENDED (END sent) -> VERIFIED (COMPLETE)
Receiver: OPENING (allocating) -> STREAMING (ACCEPT sent) -> ENDED (END seen) -> VERIFIED (digest)
Any non-terminal state -> ABORTED (with an ``AbortCode`` and a reason). A receiver may see END
before the last chunks (they travel on other connections), so STREAMING -> VERIFIED does not exist:
verification always follows END. Pure.
"""

from __future__ import annotations

import enum


class SessionState(enum.Enum):
    OPENING = "opening"
    STREAMING = "streaming"
    ENDED = "ended"
    VERIFIED = "verified"
    ABORTED = "aborted"

    @property
    def terminal(self) -> bool:
        return self in (SessionState.VERIFIED, SessionState.ABORTED)


_S = SessionState
TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    _S.OPENING: frozenset({_S.STREAMING, _S.ABORTED}),
    _S.STREAMING: frozenset({_S.ENDED, _S.ABORTED}),
    _S.ENDED: frozenset({_S.VERIFIED, _S.ABORTED}),
    _S.VERIFIED: frozenset(),
    _S.ABORTED: frozenset(),
}


def advance(src: SessionState, dst: SessionState) -> SessionState:
    """``dst`` if the table allows ``src -> dst``; ValueError naming both otherwise."""
    if dst not in TRANSITIONS[src]:
        raise ValueError(f"session cannot go from {src.value} to {dst.value}")
    return dst
