"""``TimedEngine``: the engine interface backed by the cost model instead of a GPU.

Prefill and decode take the cost model's time for the configured model and hardware (times
``time_scale`` wall seconds per modelled second) on an injected clock, and hand out KV/state
payloads with the exact per-layer sizes of ``CacheSpec.layout`` (each tensor divided by
``byte_divisor``, rounded up, when the real bytes would not fit a laptop). Decode delivers
``token_chunk`` tokens per request at a time, costed in closed form (``decode_span_s``), so a dozen
emulated H200/H20 nodes fit in one process on 2 cores. Token ids are made up (seeded per request);
lengths follow the torch engine's rules that mean something for made-up tokens: ``max_new_tokens``,
and ``stop_token_ids`` once ``min_tokens`` are out (a stop id drawn earlier is drawn again). There
is no EOS, so ``ignore_eos`` changes nothing; top-k, top-p and the repetition penalty shape real
logits only and are accepted without effect.
The timing math (``prefill_plan``, ``decode_plan``) is pure; only ``Waiter`` touches asyncio.
Must not import torch.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from prfaas.engine.api import (
    Allocation,
    CachedPrefix,
    Engine,
    FinishReason,
    LayerOutput,
    ManifestLike,
    PrefillRequest,
    PrefillResult,
    SamplingParams,
    TokenEvent,
)
from prfaas.engine.budget import KvBudget
from prfaas.engine.errors import EngineError, PromptTooLong, UnknownRequest
from prfaas.engine.manifest_check import check_manifest, scale_layout
from prfaas.engine.waiting import Waiter
from prfaas.perf import CostModel
from prfaas.spec import CacheLayout, CacheSpec, LayerSegment


@dataclass(frozen=True, slots=True)
class TimedConfig:
    time_scale: float = 1.0
    """Wall seconds per modelled second (0.1: ten times faster than the hardware)."""
    byte_divisor: int = 1
    """Payloads are 1/byte_divisor of the real size (per tensor, rounded up)."""
    token_chunk: int = 1
    """Tokens delivered per request per decode step."""
    kv_budget_bytes: int | None = None
    """Real (unscaled) KV bytes a decode node holds; default: the instance's HBM."""
    max_batch: int | None = None
    """Decode batch limit; default: the cost model's BS_max."""
    vocab_size: int = 32000
    catch_up_s: float = 0.01
    """A step (or prefill) that starts at most this long (clock seconds) after the previous one
    ended is taken to start when it ended, so wake-up lateness does not accumulate."""

    def __post_init__(self) -> None:
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.byte_divisor < 1:
            raise ValueError(f"byte_divisor must be >= 1, got {self.byte_divisor}")
        if self.token_chunk < 1:
            raise ValueError(f"token_chunk must be >= 1, got {self.token_chunk}")


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    duration_s: float
    """Wall seconds (modelled time x time_scale)."""
    layer_ready_s: tuple[float, ...]
    """Offset from the start at which each layer is handed out; the last is ``duration_s``."""


@dataclass(frozen=True, slots=True)
class DecodePlan:
    num_tokens: int
    """Tokens each request of the batch gets this step."""
    duration_s: float


@dataclass(slots=True)
class _Running:
    request_id: str
    num_tokens: int
    sampling: SamplingParams
    num_generated: int
    rng: random.Random
    stop_ids: frozenset[int]


class TimedEngine:
    def __init__(self, cost_model: CostModel, waiter: Waiter, config: TimedConfig | None = None):
        self.cost_model = cost_model
        self.waiter = waiter
        self.config = config or TimedConfig()
        cfg = self.config
        hw = cost_model.hardware
        self.budget = KvBudget(cfg.kv_budget_bytes or int(hw.instance_memory_bytes))
        self.max_batch = cfg.max_batch or max(1, cost_model.max_decode_batch)
        self._prefill_lock = asyncio.Lock()
        # When the emulated instance is next free. A step that follows another at once starts at
        # the previous deadline, not at the (slightly late) wake-up: lateness does not accumulate.
        self._prefill_free_at_s = -math.inf
        self._decode_free_at_s = -math.inf
        self._zeros = memoryview(b"")
        self._allocs: dict[str, Allocation] = {}
        self._running: dict[str, _Running] = {}

    # -- what this engine is -------------------------------------------------------------------
    @property
    def cache_spec(self) -> CacheSpec:
        return self.cost_model.model.cache

    @property
    def max_context_tokens(self) -> int:
        return self.cost_model.model.max_context_tokens

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def fault(self) -> str:
        """Always "": nothing runs outside the event loop that could die."""
        return ""

    def close(self) -> None:
        """Nothing to stop (no thread): present for the ``Engine`` interface."""

    def layout(self, num_tokens: int, num_cached_tokens: int = 0) -> CacheLayout:
        """What crosses for such a request (scaled by ``byte_divisor``)."""
        return scale_layout(
            self.cache_spec.layout(num_tokens, num_cached_tokens), self.config.byte_divisor
        )

    def _start_s(self, free_at_s: float) -> float:
        now = self.waiter.clock.now()
        return free_at_s if now - free_at_s <= self.config.catch_up_s else now

    # -- pure timing ---------------------------------------------------------------------------
    def prefill_plan(self, num_tokens: int, num_cached_tokens: int = 0) -> PrefillPlan:
        new = num_tokens - num_cached_tokens
        duration = self.cost_model.prefill_s(new, num_cached_tokens) * self.config.time_scale
        num_layers = self.cache_spec.num_layers
        ready = tuple(duration * (i + 1) / num_layers for i in range(num_layers - 1))
        return PrefillPlan(duration, (*ready, duration))

    def decode_plan(self, context_tokens: int, remaining: list[int]) -> DecodePlan:
        """One step of a batch: ``remaining`` tokens left per request, contexts summing to
        ``context_tokens``. The batch is fixed for the whole chunk (no one finishes inside it)."""
        k = min(self.config.token_chunk, *remaining)
        span = self.cost_model.decode_span_s(len(remaining), context_tokens, k)
        return DecodePlan(k, span * self.config.time_scale)

    # -- prefill -------------------------------------------------------------------------------
    def _zero_views(self, seg: LayerSegment) -> tuple[memoryview, ...]:
        need = max((t.num_bytes for t in seg.tensors), default=0)
        if need > self._zeros.nbytes:
            self._zeros = memoryview(bytes(need))
        return tuple(self._zeros[: t.num_bytes] for t in seg.tensors)

    def _outputs(self, rid: str, layout: CacheLayout) -> list[LayerOutput]:
        return [
            LayerOutput(rid, pos, seg, self._zero_views(seg))
            for pos, seg in enumerate(layout.segments)
        ]

    def _check_length(self, rid: str, num_tokens: int, max_new_tokens: int) -> None:
        if num_tokens + max_new_tokens > self.max_context_tokens:
            raise PromptTooLong(
                f"request {rid}: {num_tokens} prompt tokens + {max_new_tokens} new tokens exceed "
                f"the model's maximum of {self.max_context_tokens}"
            )

    async def prefill_stream(
        self, req: PrefillRequest
    ) -> AsyncIterator[LayerOutput | PrefillResult]:
        """Layer ``i`` is handed out when the cost model says it is done; prefills on one engine
        run one after the other, like on one instance."""
        self._check_length(req.request_id, req.num_tokens, req.sampling.max_new_tokens)
        n, k = req.num_tokens, req.num_cached_tokens
        async with self._prefill_lock:
            plan = self.prefill_plan(n, k)
            start = self._start_s(self._prefill_free_at_s)
            self._prefill_free_at_s = start + plan.duration_s
            outputs = self._outputs(req.request_id, self.layout(n, k))
            for ready, out in zip(plan.layer_ready_s, outputs, strict=True):
                await self.waiter.wait_until(start + ready)
                yield out
        checkpoints: tuple[CachedPrefix, ...] = ()
        block = req.checkpoint_block_tokens
        if block is not None:
            checkpoints = tuple(
                CachedPrefix(b, tuple(self._outputs(req.request_id, self.layout(b, 0))))
                for b in range((k // block + 1) * block, n + 1, block)
            )
        first = self._draw(_rng(req.request_id, req.sampling), req.sampling, 0)
        yield PrefillResult(req.request_id, first, n, k, checkpoints)

    # -- joining the decode batch -------------------------------------------------------------
    def allocate(self, manifest: ManifestLike, max_new_tokens: int) -> Allocation:
        rid = manifest.request_id
        if rid in self._allocs or rid in self._running:
            raise EngineError(f"request {rid} already has a cache here")
        real = check_manifest(
            self.cache_spec, manifest, self.max_context_tokens, self.config.byte_divisor
        )
        self._check_length(rid, real.num_tokens, max_new_tokens)
        reserved = self.cache_spec.bytes_for(real.num_tokens + max_new_tokens)
        layout = self.layout(real.num_tokens, real.num_cached_tokens)
        alloc = self.budget.allocate(rid, layout, reserved)
        self._allocs[rid] = alloc
        return alloc

    def install(
        self,
        allocation: Allocation,
        first_token: int,
        sampling: SamplingParams,
        prefix: CachedPrefix | None = None,
        prompt_token_ids: Sequence[int] = (),
    ) -> TokenEvent:
        rid = allocation.request_id
        if self._allocs.pop(rid, None) is not allocation:
            raise UnknownRequest(f"request {rid} has no pending allocation here")
        stop = frozenset(sampling.stop_token_ids)
        run = _Running(rid, allocation.layout.num_tokens, sampling, 1, _rng(rid, sampling), stop)
        self._draw(run.rng, sampling, 0)  # the first token was drawn by the prefill: skip it
        reason = self._reason(run, first_token)
        if reason is not None:
            self.budget.release(rid)
            return TokenEvent(rid, (first_token,), reason)
        self._running[rid] = run
        return TokenEvent(rid, (first_token,))

    def _draw(self, rng: random.Random, sampling: SamplingParams, token_index: int) -> int:
        """A made-up token; while ``token_index < min_tokens`` never a stop id (like masking)."""
        vocab = self.config.vocab_size
        token = rng.randrange(vocab)
        if token_index >= sampling.min_tokens or token not in sampling.stop_token_ids:
            return token
        for _ in range(64):  # a few redraws, then the first allowed id: always terminates
            token = rng.randrange(vocab)
            if token not in sampling.stop_token_ids:
                return token
        return next((t for t in range(vocab) if t not in sampling.stop_token_ids), token)

    @staticmethod
    def _reason(run: _Running, token: int) -> FinishReason | None:
        if token in run.stop_ids:
            return FinishReason.STOP
        if run.num_generated >= run.sampling.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def release(self, request_id: str) -> None:
        self._allocs.pop(request_id, None)
        self._running.pop(request_id, None)
        self.budget.release(request_id)

    # -- decode ---------------------------------------------------------------------------------
    def next_decode_plan(self) -> DecodePlan | None:
        """What the next ``step_async`` will take (None when nothing runs)."""
        runs = list(self._running.values())[: self.max_batch]
        if not runs:
            return None
        context = sum(r.num_tokens + r.num_generated for r in runs)
        return self.decode_plan(
            context, [r.sampling.max_new_tokens - r.num_generated for r in runs]
        )

    async def step_async(self) -> tuple[TokenEvent, ...]:
        """``token_chunk`` tokens (fewer if a request needs fewer) for each running request."""
        plan = self.next_decode_plan()
        if plan is None:
            return ()
        runs = list(self._running.values())[: self.max_batch]
        start = self._start_s(self._decode_free_at_s)
        self._decode_free_at_s = start + plan.duration_s
        await self.waiter.wait_until(self._decode_free_at_s)
        events = []
        for run in runs:
            tokens: list[int] = []
            reason = None
            while reason is None and len(tokens) < plan.num_tokens:
                token = self._draw(run.rng, run.sampling, run.num_generated)
                tokens.append(token)
                run.num_generated += 1
                reason = self._reason(run, token)
            if reason is not None:
                self.release(run.request_id)
            events.append(TokenEvent(run.request_id, tuple(tokens), reason))
        return tuple(events)


def _rng(request_id: str, sampling: SamplingParams) -> random.Random:
    return random.Random(f"{request_id}:{sampling.seed}")


def _conforms(engine: TimedEngine) -> Engine:
    return engine  # mypy checks that TimedEngine offers the whole Engine interface
