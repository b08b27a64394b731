"""A request's life: ``RequestState`` and the one table of transitions allowed between states.

Every request ends in FINISHED, FAILED (with a reason the client sees) or ABORTED (the client went
away or cancelled). A failed remote prefill or transfer may be retried (ROUTED again) before the
request is given up. Pure: no I/O, no clock reads (times are passed in).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from prfaas.core.ids import NodeId, RequestId, SiteId


class RequestState(enum.Enum):
    QUEUED = "queued"
    """Accepted by the gateway, not yet routed."""
    ROUTED = "routed"
    """The router chose a prefill node and a decode node; waiting in the prefill node's queue."""
    PREFILLING = "prefilling"
    """The prefill node is computing the uncached suffix (KV may already be streaming out)."""
    TRANSFERRING = "transferring"
    """Prefill done; the last KV bytes are crossing to the decode node."""
    DECODING = "decoding"
    """KV verified at the decode node; tokens are being generated."""
    FINISHED = "finished"
    FAILED = "failed"
    ABORTED = "aborted"


TERMINAL_STATES = frozenset({RequestState.FINISHED, RequestState.FAILED, RequestState.ABORTED})

_S = RequestState
# The one transition table. ROUTED is reachable again from PREFILLING/TRANSFERRING: a lost remote
# prefill or transfer falls back to local prefill (DESIGN decision 7).
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


def can_transition(src: RequestState, dst: RequestState) -> bool:
    return dst in TRANSITIONS[src]


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the serving system tracks it. Immutable: ``advance`` returns a copy."""

    request_id: RequestId
    num_prompt_tokens: int
    """Prompt length in tokens (cached prefix included)."""
    max_output_tokens: int
    arrival_s: float
    """When the request arrived, on the driver's clock."""
    block_hashes: tuple[int, ...] = ()
    """Hashes of the prompt's full blocks, in order (prefix structure for the caches)."""
    state: RequestState = RequestState.QUEUED
    state_since_s: float = 0.0
    prefill_site: SiteId | None = None
    prefill_node: NodeId | None = None
    decode_node: NodeId | None = None
    num_cached_tokens: int = 0
    """Prefix tokens the chosen prefill node did not have to compute."""
    failure_reason: str = ""
    num_attempts: int = field(default=0)
    """How many times the request has been routed (retries after a lost remote prefill count)."""

    def __post_init__(self) -> None:
        if self.num_prompt_tokens <= 0:
            raise ValueError(f"num_prompt_tokens must be > 0, got {self.num_prompt_tokens}")
        if self.max_output_tokens <= 0:
            raise ValueError(f"max_output_tokens must be > 0, got {self.max_output_tokens}")

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def advance(self, state: RequestState, now_s: float, **changes: object) -> Request:
        """The request in ``state`` from ``now_s`` on; ``InvalidTransition`` if not allowed."""
        if not can_transition(self.state, state):
            raise InvalidTransition(
                f"request {self.request_id}: {self.state.value} -> {state.value} is not allowed"
            )
        attempts = self.num_attempts + (1 if state is RequestState.ROUTED else 0)
        return replace(
            self,
            state=state,
            state_since_s=now_s,
            num_attempts=attempts,
            **changes,  # type: ignore[arg-type]
        )
