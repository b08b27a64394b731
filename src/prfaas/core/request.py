"""A request's life: ``RequestState``, the one table of transitions allowed between states, and
``RequestLifecycle``, the live gateway's record of one request moving through it.

Both drivers move their requests through this table and nothing else: the live dispatcher
(``serve/gateway/dispatcher.py``) holds a ``RequestLifecycle`` per request across its attempts;
the simulator's ``SimRequest`` (``sim/request.py``) carries a ``RequestState`` that its stages
advance with the same check inline (its hot path cannot afford a call per transition). A move the
table does not allow raises ``InvalidTransition`` in both: a bookkeeping bug fails loudly instead
of reporting a request in a stage it never reached.

Every request ends in FINISHED, FAILED (with a reason the client sees) or ABORTED (the client went
away or cancelled). A failed remote prefill or transfer may be retried (ROUTED again) before the
request is given up; once tokens have been streamed (DECODING) it is not. Pure: no I/O, no clock
reads (times are passed in). Imports nothing but the standard library.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class RequestState(enum.StrEnum):
    # A StrEnum: hashed and compared as its string, in C (a plain Enum's hash is a Python call,
    # which the simulator's per-transition table lookup would pay five times a request).
    QUEUED = "queued"
    """Accepted by the gateway, not yet routed."""
    ROUTED = "routed"
    """The router chose a prefill node and a decode node; a cache move may be under way; waiting
    in the prefill node's queue."""
    PREFILLING = "prefilling"
    """The prefill node is computing the uncached suffix (KV may already be streaming out)."""
    TRANSFERRING = "transferring"
    """Prefill done; the last KV bytes are crossing to the decode node."""
    DECODING = "decoding"
    """The KV is whole at the decode node (the first token is due: TTFT ends here); the request
    generates, or waits there for a batch slot."""
    FINISHED = "finished"
    FAILED = "failed"
    ABORTED = "aborted"


TERMINAL_STATES = frozenset({RequestState.FINISHED, RequestState.FAILED, RequestState.ABORTED})

_S = RequestState
# The one transition table. ROUTED is reachable again from PREFILLING/TRANSFERRING: a lost remote
# prefill or transfer falls back to local prefill (DESIGN decision 7). PREFILLING -> DECODING: the
# live gateway may see the first token before the prefill node's own answer.
TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    _S.QUEUED: frozenset({_S.ROUTED, _S.FAILED, _S.ABORTED}),
    _S.ROUTED: frozenset({_S.PREFILLING, _S.ROUTED, _S.FAILED, _S.ABORTED}),
    _S.PREFILLING: frozenset({_S.TRANSFERRING, _S.DECODING, _S.ROUTED, _S.FAILED, _S.ABORTED}),
    _S.TRANSFERRING: frozenset({_S.DECODING, _S.ROUTED, _S.FAILED, _S.ABORTED}),
    _S.DECODING: frozenset({_S.FINISHED, _S.FAILED, _S.ABORTED}),
    _S.FINISHED: frozenset(),
    _S.FAILED: frozenset(),
    _S.ABORTED: frozenset(),
}


class InvalidTransition(ValueError):
    """A state change that the transition table does not allow."""

    def __init__(self, who: str, src: RequestState, dst: RequestState) -> None:
        super().__init__(f"request {who}: {src.value} -> {dst.value} is not allowed")
        self.src = src
        self.dst = dst


def can_transition(src: RequestState, dst: RequestState) -> bool:
    return dst in TRANSITIONS[src]


def advance(who: str, src: RequestState, dst: RequestState) -> RequestState:
    """``dst``, if the table allows ``src -> dst``; else ``InvalidTransition`` naming ``who``."""
    if dst not in TRANSITIONS[src]:
        raise InvalidTransition(who, src, dst)
    return dst


class RequestLifecycle:
    """Where one live request is, across its attempts: its state, since when (on the caller's
    clock) and how many times it was routed. Mutable: one per request, owned by the dispatcher's
    ``generate``."""

    __slots__ = ("num_attempts", "on_leave", "path", "request_id", "since_s", "state")

    def __init__(
        self,
        request_id: str,
        now_s: float,
        on_leave: Callable[[RequestState, float], None] | None = None,
    ) -> None:
        """``on_leave(state, seconds)``: told of each state left and the time spent in it (the
        gateway's per-state histogram: where a request's time goes, hop by hop)."""
        self.request_id = request_id
        self.on_leave = on_leave
        self.state = RequestState.QUEUED
        self.since_s = now_s
        self.num_attempts = 0
        """Times routed (a retry after a lost remote prefill counts)."""
        self.path: list[RequestState] = [RequestState.QUEUED]
        """Every state it was in, in order (for logs and tests)."""

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def advance(self, state: RequestState, now_s: float) -> None:
        """Move to ``state`` from ``now_s`` on; ``InvalidTransition`` if the table forbids it."""
        left, spent_s = self.state, now_s - self.since_s
        self.state = advance(self.request_id, self.state, state)
        self.since_s = now_s
        if self.on_leave is not None:
            self.on_leave(left, spent_s)
        self.path.append(state)
        if state is RequestState.ROUTED:
            self.num_attempts += 1
