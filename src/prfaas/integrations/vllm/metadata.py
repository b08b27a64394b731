"""What the connector's scheduler side (EngineCore) tells its worker side per step: the prefill
requests' send steps, the decode requests' loads, sessions to abort, loads to cancel.

vLLM pickles ``PrfaasMetadata`` from the EngineCore process to the Worker process, so these are
plain dataclasses. Imports vllm (the metadata base class), not torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from prfaas.integrations.vllm.settings import LoadParams, SendParams


@dataclass(frozen=True, slots=True)
class SendStep:
    """One scheduled step of a prefill request: tokens ``[start, end)`` complete in it."""

    req_id: str
    params: SendParams
    prompt_len: int
    block_ids: tuple[tuple[int, ...], ...]
    """Per KV cache group (attention groups: per block of tokens; state groups: see
    ``layout.state_block``)."""
    start: int
    end: int
    opens: bool
    """First step of the request: open the session first."""
    last: bool
    """The prompt is complete after this step: finish the session after it."""


@dataclass(frozen=True, slots=True)
class LoadJob:
    """A decode request whose tokens ``[start, prompt_len)`` come from session ``transfer_id``."""

    req_id: str
    params: LoadParams
    prompt_len: int
    """Tokens the session covers: the prompt less the token the decode side recomputes when the
    model has linear layers (their state is then the state before that token)."""
    start: int
    block_ids: tuple[tuple[int, ...], ...]
    """Per KV cache group."""
    single_group: bool
    error: str = ""
    """Set when the scheduler side failed preparing it: the worker reports the load failed."""


@dataclass
class PrfaasMetadata(KVConnectorMetadata):  # type: ignore[misc]  # vllm is untyped here
    sends: list[SendStep] = field(default_factory=list)
    loads: list[LoadJob] = field(default_factory=list)
    abort_sends: list[tuple[str, str]] = field(default_factory=list)
    """(transfer id, why) of prefill requests whose session must fail: ended before their
    prompt was complete, or a fault on the scheduler side."""
    cancel_loads: list[str] = field(default_factory=list)
    """Request ids of decode requests aborted while their KV was awaited."""
