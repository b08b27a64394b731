"""The engine interface shared by ``engine.torch`` (real models) and ``engine.timed`` (cost model).

What crosses the boundary, as frozen dataclasses: a prefill request, the per-layer outputs a prefill
hands out as each layer finishes, the prefill's result (first token, block checkpoints), cached
prefixes, allocations for incoming transfers and the tokens a decode step streams out. A chunked
prefill hands full-attention layers out chunk by chunk (``LayerOutput.rows``).
Payload bytes are ``memoryview`` s laid out exactly as ``CacheSpec.layout`` says (tensors of a
layer back to back, token-major), so they can go to a socket as they are.
Must not import torch or asyncio.
"""

from __future__ import annotations

import enum
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prfaas.spec import CacheLayout, CacheSpec, DType, LayerKind, LayerSegment

DEFAULT_BLOCK_TOKENS = 512
"""Prefix-cache block size (the trace's hash blocks): ask for checkpoints every this many tokens."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How tokens are chosen and when generation stops."""

    max_new_tokens: int = 16
    """Tokens to generate, the prefill's first token included."""
    temperature: float = 0.0
    """0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches ``top_p``."""
    seed: int = 0
    """Seeds this request's own generator: same seed, same tokens, whatever the batch."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation stops after emitting one of these (the model's EOS is added unless ignore_eos)."""
    ignore_eos: bool = False
    top_k: int = -1
    """Keep only the ``top_k`` most likely tokens before top-p; -1 or 0: no limit."""
    min_tokens: int = 0
    """EOS and ``stop_token_ids`` cannot be chosen until this many tokens have been generated
    (counted like ``max_new_tokens``, the prefill's first token included)."""
    repetition_penalty: float = 1.0
    """Hugging Face semantics over the prompt and the output so far: a seen token's positive
    logit is divided by it, a negative one multiplied. 1: off."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (no limit) or > 0, got {self.top_k}")
        if not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {self.min_tokens}"
            )
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


@dataclass(frozen=True, slots=True)
class LayerOutput:
    """One layer's share of a request's cache, ready to send: ``segment`` says what it is.

    A prefill cut into chunks hands a full-attention layer out once per chunk: each output then
    carries token rows ``rows = (start, end)`` of ``segment`` only (absolute token indices inside
    ``[segment.first_token, segment.first_token + segment.num_token_rows)``), and the outputs of
    one layer together cover the segment exactly once. SWA windows and linear states are only
    final after the last chunk, so they always come whole (``rows`` None)."""

    request_id: str
    position: int
    """Index of this layer in the cache spec (= in the manifest), not the model's layer number."""
    segment: LayerSegment
    buffers: tuple[memoryview, ...]
    """One buffer per tensor of ``segment``, in order; each exactly ``TensorSlice.num_bytes``,
    or, with ``rows``, exactly that tensor's bytes for those rows."""
    rows: tuple[int, int] | None = None
    """Token rows ``[start, end)`` this output carries; None: the whole segment."""

    def __post_init__(self) -> None:
        if self.rows is None:
            return
        start, end = self.rows
        seg = self.segment
        if not seg.kind.grows_with_length:
            raise ValueError(f"layer {self.position}: only full-attention rows come in parts")
        if not seg.first_token <= start < end <= seg.first_token + seg.num_token_rows:
            raise ValueError(
                f"layer {self.position}: rows [{start}, {end}) outside the segment's "
                f"[{seg.first_token}, {seg.first_token + seg.num_token_rows})"
            )
        for buf, t in zip(self.buffers, seg.tensors, strict=True):
            if buf.nbytes != (end - start) * (t.num_bytes // seg.num_token_rows):
                raise ValueError(
                    f"layer {self.position}, tensor {t.name}: {buf.nbytes} bytes for rows "
                    f"[{start}, {end})"
                )

    @property
    def num_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    @property
    def row_span(self) -> tuple[int, int]:
        """The token rows carried: ``rows``, or the whole segment's."""
        if self.rows is not None:
            return self.rows
        return (self.segment.first_token, self.segment.first_token + self.segment.num_token_rows)

    def pieces(self) -> tuple[tuple[int, memoryview], ...]:
        """``(offset_bytes, view)`` pairs inside this layer's segment (tensors back to back, each
        token-major), so a partial output's rows land where the whole segment has them."""
        if self.rows is None:
            out, offset = [], 0
            for buf in self.buffers:
                out.append((offset, buf))
                offset += buf.nbytes
            return tuple(out)
        seg, skip = self.segment, self.rows[0] - self.segment.first_token
        parts, base = [], 0
        for buf, t in zip(self.buffers, seg.tensors, strict=True):
            parts.append((base + skip * (t.num_bytes // seg.num_token_rows), buf))
            base += t.num_bytes
        return tuple(parts)


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """A request's cache as of ``num_tokens``: every layer of ``CacheSpec.layout(num_tokens, 0)``.

    Full-attention layers carry KV rows ``[0, num_tokens)``; SWA and linear layers their state at
    exactly ``num_tokens``. A prefill that starts from it computes only the suffix.
    """

    num_tokens: int
    layers: tuple[LayerOutput, ...]

    @property
    def num_bytes(self) -> int:
        return sum(la.num_bytes for la in self.layers)


@dataclass(frozen=True, slots=True)
class PrefillRequest:
    request_id: str
    token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cached: CachedPrefix | None = None
    """Start from this prefix (its first ``num_tokens`` must be this prompt's first tokens)."""
    checkpoint_block_tokens: int | None = None
    """Keep the state at every multiple of this many tokens (block-aligned prefix checkpoints;
    ``DEFAULT_BLOCK_TOKENS`` normally, 64 in tests). None: no checkpoints."""

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError("request_id must not be empty")
        if not self.token_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")
        if self.cached is not None and self.cached.num_tokens >= len(self.token_ids):
            raise ValueError(
                f"request {self.request_id}: cached prefix of {self.cached.num_tokens} tokens must "
                f"be shorter than the prompt ({len(self.token_ids)} tokens)"
            )
        if self.checkpoint_block_tokens is not None and self.checkpoint_block_tokens <= 0:
            raise ValueError(
                f"checkpoint_block_tokens must be > 0, got {self.checkpoint_block_tokens}"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_cached_tokens(self) -> int:
        return 0 if self.cached is None else self.cached.num_tokens


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """What a prefill ends with. The first generated token comes from the prefill's own logits,
    so the prefill side sends it along with the cache."""

    request_id: str
    first_token: int
    num_tokens: int
    num_cached_tokens: int
    checkpoints: tuple[CachedPrefix, ...] = ()
    """Block-aligned prefixes (only when the request asked for checkpoints)."""


class FinishReason(enum.Enum):
    LENGTH = "length"
    """``max_new_tokens`` reached."""
    STOP = "stop"
    """EOS or a stop token emitted."""
    ERROR = "error"
    """The engine failed this request alone (``TokenEvent.error`` says why); it left the batch."""


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """Tokens of one request produced by one decode step (or the prefill's first token)."""

    request_id: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    error: str = ""
    """Why, when ``finish_reason`` is ``ERROR``."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class ManifestTensor(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> DType: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


class ManifestLayer(Protocol):
    @property
    def layer_index(self) -> int: ...
    @property
    def kind(self) -> LayerKind: ...
    @property
    def first_token(self) -> int: ...
    @property
    def num_token_rows(self) -> int: ...
    @property
    def tensors(self) -> tuple[ManifestTensor, ...]: ...


class ManifestLike(Protocol):
    """What ``allocate`` reads from a transfer manifest (``prfaas.transfer.Manifest`` fits)."""

    @property
    def request_id(self) -> str: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_cached_tokens(self) -> int: ...
    @property
    def layers(self) -> tuple[ManifestLayer, ...]: ...


@dataclass(frozen=True, slots=True)
class Allocation:
    """Buffers reserved for one incoming cache: ``layer_buffers[i]`` is layer ``i`` of ``layout``
    (tensors back to back), writable. The transfer writes into them, then ``install`` takes them."""

    request_id: str
    layout: CacheLayout
    layer_buffers: tuple[memoryview, ...]
    reserved_bytes: int
    """What the budget holds for this request (its cache at the end of generation)."""


class BudgetGauge(Protocol):
    """What a node reads of an engine's KV budget (``engine.budget.KvBudget`` offers it)."""

    @property
    def used_bytes(self) -> int: ...
    @property
    def budget_bytes(self) -> int: ...


class Engine(Protocol):
    """What ``engine.torch.TorchEngine`` and ``engine.timed.TimedEngine`` both offer."""

    @property
    def budget(self) -> BudgetGauge:
        """The KV budget a node reports (used and total bytes)."""
        ...

    @property
    def cache_spec(self) -> CacheSpec: ...
    @property
    def max_context_tokens(self) -> int: ...
    @property
    def num_running(self) -> int: ...
    @property
    def fault(self) -> str:
        """Non-empty when the engine can serve nothing more (its engine thread died): why."""
        ...

    @property
    def engine_cpu_s(self) -> float:
        """CPU seconds spent in forward passes since it started (0: none run on a CPU here)."""
        ...

    @property
    def forward_cpu_s(self) -> float:
        """Of ``engine_cpu_s``, the model's forward passes alone (what a profile's curves price;
        their sampling, layer hand-out and cache copies left out)."""
        ...

    def layout(self, num_tokens: int, num_cached_tokens: int = 0) -> CacheLayout:
        """What crosses for such a request (the wire manifest is built from it)."""
        ...

    def prefill_stream(self, req: PrefillRequest) -> AsyncIterator[LayerOutput | PrefillResult]:
        """Each layer's ``LayerOutput`` as soon as it is ready, then the ``PrefillResult``."""
        ...

    def allocate(self, manifest: ManifestLike, max_new_tokens: int) -> Allocation:
        """Buffers for an incoming cache, or ``ManifestMismatch`` / ``PromptTooLong`` /
        ``BudgetExceeded`` with nothing reserved."""
        ...

    def install(
        self,
        allocation: Allocation,
        first_token: int,
        sampling: SamplingParams,
        prefix: CachedPrefix | None = None,
        prompt_token_ids: Sequence[int] = (),
    ) -> TokenEvent:
        """Join the decode batch with a filled (verified) allocation; the first token's event.
        ``prompt_token_ids`` (when known) feed the repetition penalty. ``first_token`` < 0 (the
        wire's "none": a vLLM prefill server's END) means the sender sampled none: the engine
        makes the first token itself, and the event may carry no token yet."""
        ...

    def release(self, request_id: str) -> None: ...
    async def step_async(self) -> tuple[TokenEvent, ...]:
        """One decode step (or chunk of steps) for the running batch. A request the engine fails
        alone gets an event with ``FinishReason.ERROR``; a dead engine raises ``EngineDead``."""
        ...

    def close(self) -> None:
        """Stop (and join) whatever the engine runs on; pending work fails with a reason."""
        ...
