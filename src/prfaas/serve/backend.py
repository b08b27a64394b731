"""The seam between the gateway's HTTP surface (``serve.api``) and what generates tokens.

``serve.api`` turns OpenAI-style HTTP requests into ``GenerationRequest``s and relays the
``TokenEvent``s a ``Backend`` yields; the dispatcher (router + prefill/decode nodes) implements
``Backend``. Frozen dataclasses only; this module imports neither pydantic nor FastAPI nor torch.

Contract of ``Backend.generate`` (an async generator):
- yields ``TokenEvent``s in order; the last one carries ``finish_reason`` "stop" (a stop token or
  EOS was generated; the stop token itself is NOT in ``token_ids`` and not counted) or "length"
  (``max_tokens`` reached);
- raises ``GenerationError`` for a failure the client should see (status, type, message);
- cancellation means the client went away or the deadline passed: the gateway either cancels the
  task awaiting ``__anext__`` (``CancelledError`` inside the generator) or calls ``aclose()``
  (``GeneratorExit`` at the ``yield``). Either way the backend must abort the request everywhere
  and free its KV; put that in a ``finally``. The generator must not swallow the cancellation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One validated, tokenized request, as the gateway hands it to the backend."""

    request_id: str
    """Unique per request ("cmpl-..." / "chatcmpl-..."); also the id the client sees."""
    prompt_token_ids: tuple[int, ...]
    """The whole prompt (chat template already applied); never empty."""
    max_tokens: int
    """Upper bound on generated tokens, >= 1; prompt + max_tokens <= the model's context."""
    temperature: float
    """0 means greedy."""
    top_p: float
    """Nucleus sampling mass in (0, 1]."""
    seed: int | None
    """Per-request sampling seed, if the client gave one."""
    stop_token_ids: tuple[int, ...]
    """Extra stop tokens besides the model's EOS."""
    arrival_s: float
    """When the gateway received the request, on the gateway's monotonic clock."""
    top_k: int = -1
    """Sample among the k most likely tokens; -1 (or 0) means no limit."""
    min_tokens: int = 0
    """EOS and stop tokens are suppressed until this many tokens were generated."""
    repetition_penalty: float = 1.0
    """vLLM/HF-style penalty (> 0) on logits of tokens already in prompt or output; 1 is off."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmark clients ask for it); stop tokens still stop."""

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")
        if self.max_tokens < 1:
            raise ValueError(
                f"request {self.request_id}: max_tokens must be >= 1, got {self.max_tokens}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(
                f"request {self.request_id}: top_p must be in (0, 1], got {self.top_p}"
            )
        if self.temperature < 0:
            raise ValueError(
                f"request {self.request_id}: temperature must be >= 0, got {self.temperature}"
            )


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """Newly generated tokens (usually one), and why generation ended if it did."""

    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    """None while generating; "stop" or "length" on the last event."""
    num_cached_tokens: int | None = None
    """Prompt tokens the request found in a prefix cache, once the backend knows it (at the
    latest on the last event); None on events that do not carry it."""

    def __post_init__(self) -> None:
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"finish_reason must be one of {FINISH_REASONS} or None, got {self.finish_reason!r}"
            )


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    """The model id clients put in ``"model"``."""
    max_context_tokens: int
    """Prompt + generated tokens may not exceed this."""

    def __post_init__(self) -> None:
        if self.max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2, got {self.max_context_tokens}")


class GenerationError(Exception):
    """A failure the client should see, with an HTTP status and an OpenAI error type.

    Examples: ``GenerationError(503, "service_unavailable", "no decode node available")``,
    ``GenerationError(504, "timeout", "prefill did not finish in 30 s")``,
    ``GenerationError(400, "invalid_request_error", "prompt too long",
    code="context_length_exceeded")``.
    """

    def __init__(
        self, status: int, error_type: str, message: str, *, code: str | None = None
    ) -> None:
        if not 400 <= status <= 599:
            raise ValueError(f"GenerationError status must be 4xx or 5xx, got {status}")
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.code = code

    def __repr__(self) -> str:
        return f"GenerationError({self.status}, {self.error_type!r}, {self.message!r})"


class Backend(Protocol):
    """What the gateway's HTTP surface needs from the system behind it."""

    def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """An async generator of ``TokenEvent``s (``async def`` with ``yield``); see the module
        docstring for the finish and cancellation contract."""
        ...

    def model_info(self) -> ModelInfo: ...

    async def health(self) -> dict[str, Any]:
        """Anything JSON-serialisable; ``{"status": "ok", ...}`` when able to serve. A
        ``"status"`` other than "ok", or an exception, makes ``GET /health`` answer 503."""
        ...

    async def ready(self) -> str | None:
        """None when a request could be served now (``GET /ready`` answers 200); otherwise the
        reason it could not (``GET /ready`` answers 503 with it), e.g. "no decode node in
        rotation"."""
        ...
