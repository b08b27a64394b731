"""The decode node's translations between the wire messages (``serve.node.messages``) and the
engine's types: a command's sampling as the engine's ``SamplingParams`` (``sampling_from``), and
an engine ``TokenEvent`` as the ``DecodeEvent`` the gateway reads (``decode_event_of``).

Pure: no I/O, no asyncio, no clock. Must not import the node (``serve.node.worker``, which calls
these) nor ``transfer``.
"""

from __future__ import annotations

from typing import Literal

from prfaas.engine import FinishReason, SamplingParams, TokenEvent
from prfaas.serve.node.messages import DecodeEvent, SamplingMsg


def sampling_from(msg: SamplingMsg) -> SamplingParams:
    """The engine's parameters; ``ValueError`` naming the field if they cannot be honoured."""
    return SamplingParams(
        max_new_tokens=msg.max_new_tokens,
        temperature=msg.temperature,
        top_p=msg.top_p,
        seed=0 if msg.seed is None else msg.seed,
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
        top_k=msg.top_k,
        min_tokens=msg.min_tokens,
        repetition_penalty=msg.repetition_penalty,
    )


def decode_event_of(event: TokenEvent) -> DecodeEvent | None:
    """What the decode stream says of one engine event of its request; None when nothing (no
    token and no end)."""
    if event.finish_reason is FinishReason.ERROR:  # the engine failed this request alone
        return DecodeEvent(kind="error", error=f"engine: {event.error}")
    tokens = list(event.token_ids)
    reason: Literal["stop", "length"] | None = None
    if event.finish_reason is FinishReason.STOP:
        reason = "stop"
        if tokens:
            tokens.pop()  # the stop token / EOS itself is not returned to the client
    elif event.finish_reason is FinishReason.LENGTH:
        reason = "length"
    if not tokens and reason is None:
        return None  # installed with the first token still to compute (the sender sampled none)
    return DecodeEvent(kind="tokens", token_ids=tokens, finish_reason=reason)
