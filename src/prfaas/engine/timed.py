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
Prefills are batched and decodes admitted by the simulator's own ``policy/`` objects, with the
parameters the simulator takes from the same deployment file: ``PrefillBatcher`` (a batch is the
longest head of this node's FIFO queue within ``prefill_token_budget`` uncached tokens, formed when
the instance frees; a lone request starts at once; a batch lasts the sum of its members' times and
every member hands out layer ``i`` at ``(i + 1) / L`` of it) and ``DecodeAdmission`` (a request
whose KV arrived joins the batch at the next step while the batch is below ``max_batch`` and the
batch's KV fits ``decode_kv_fraction`` of the instance's HBM; else it waits, FIFO).
The timing math (``prefill_plan``, ``decode_plan``) is pure; only ``Waiter`` touches asyncio time
(one task per engine forms the next prefill batch when the instance frees). Must not import torch.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
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
from prfaas.policy.batching import PREFILL_LOOKAHEAD, DecodeAdmission, PrefillBatcher
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
    """Decode batch limit; default: the cost model's BS_max (the simulator's)."""
    prefill_token_budget: int = 32768
    """Uncached tokens one prefill batch may hold (``simulation.prefill_token_budget``)."""
    decode_kv_fraction: float = 0.25
    """Share of the instance's HBM the decode batch's KV may fill before a request whose KV
    arrived waits (``simulation.decode_kv_fraction``, the simulator's decode KV capacity)."""
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
        if not 0 < self.decode_kv_fraction <= 1:
            raise ValueError(f"decode_kv_fraction must be in (0, 1], got {self.decode_kv_fraction}")


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


@dataclass(frozen=True, slots=True)
class PrefillBatchStart:
    """A prefill batch as it starts (``TimedEngine.on_prefill_batch``): its requests in queue
    order, when it starts and how long it lasts (clock seconds)."""

    request_ids: tuple[str, ...]
    start_s: float
    duration_s: float


@dataclass(slots=True)
class _PrefillJob:
    request_id: str
    num_new_tokens: int
    work_s: float
    """Clock seconds this request's prefill takes alone (``prefill_plan``)."""
    batch: asyncio.Future[PrefillBatchStart]
    """Set when the batcher puts this request into a starting batch."""


@dataclass(slots=True)
class _Running:
    request_id: str
    num_tokens: int
    sampling: SamplingParams
    num_generated: int
    rng: random.Random
    stop_ids: frozenset[int]
    reserved_bytes: int
    """KV bytes at the end of generation: what ``DecodeAdmission`` weighs."""


class TimedEngine:
    def __init__(self, cost_model: CostModel, waiter: Waiter, config: TimedConfig | None = None):
        self.cost_model = cost_model
        self.waiter = waiter
        self.config = config or TimedConfig()
        cfg = self.config
        hw = cost_model.hardware
        self.budget = KvBudget(cfg.kv_budget_bytes or int(hw.instance_memory_bytes))
        self.max_batch = cfg.max_batch or max(1, cost_model.max_decode_batch)
        self.batcher = PrefillBatcher(cfg.prefill_token_budget)
        self.admission = DecodeAdmission(self.max_batch)
        self.decode_kv_capacity_bytes = int(hw.instance_memory_bytes * cfg.decode_kv_fraction)
        self.on_prefill_batch: Callable[[PrefillBatchStart], None] | None = None
        """Called as each prefill batch starts (tests comparing batches with the simulator's)."""
        self._prefill_queue: deque[_PrefillJob] = deque()
        self._prefill_members_left = 0
        """Members of the running prefill batch not yet past their last layer (0: free). The
        last one forms the next batch, at the batch's end: no task, nothing else waits on the
        clock (a ``VirtualWaiter`` stays exact)."""
        # When the emulated instance is next free. A step that follows another at once starts at
        # the previous deadline, not at the (slightly late) wake-up: lateness does not accumulate.
        self._prefill_free_at_s = -math.inf
        self._decode_free_at_s = -math.inf
        self._zeros = memoryview(b"")
        self._allocs: dict[str, Allocation] = {}
        self._running: dict[str, _Running] = {}
        """The decode batch (admitted), in admission order."""
        self._waiting: dict[str, _Running] = {}
        """Installed (KV here, first token out) and waiting for admission, FIFO."""
        self._batch_kv_bytes = 0

    # -- what this engine is -------------------------------------------------------------------
    @property
    def cache_spec(self) -> CacheSpec:
        return self.cost_model.model.cache

    @property
    def max_context_tokens(self) -> int:
        return self.cost_model.model.max_context_tokens

    @property
    def num_running(self) -> int:
        """Installed requests: the decode batch and those waiting to join it (both hold KV here
        and are not done; the worker reports this figure as its batch)."""
        return len(self._running) + len(self._waiting)

    @property
    def num_batched(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def fault(self) -> str:
        """Always "": nothing runs outside the event loop that could die."""
        return ""

    @property
    def engine_cpu_s(self) -> float:
        """Always 0: its passes are sleeps."""
        return 0.0

    @property
    def forward_cpu_s(self) -> float:
        """Always 0: its passes are sleeps."""
        return 0.0

    def close(self) -> None:
        """Fails the queued prefills (no thread to join)."""
        while self._prefill_queue:  # queued prefills fail rather than wait for ever
            self._prefill_queue.popleft().batch.set_exception(EngineError("engine closed"))

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
        """Queued, then prefilled in the batch ``PrefillBatcher`` puts it in: layer ``i`` is
        handed out at ``(i + 1) / L`` of the batch's time, like the simulator's transfer."""
        self._check_length(req.request_id, req.num_tokens, req.sampling.max_new_tokens)
        n, k = req.num_tokens, req.num_cached_tokens
        job = _PrefillJob(
            req.request_id,
            n - k,
            self.prefill_plan(n, k).duration_s,
            asyncio.get_running_loop().create_future(),
        )
        self._prefill_queue.append(job)
        if self._prefill_members_left == 0:  # the instance is free: a lone request starts now
            self._start_prefill_batch()
        try:
            batch = await job.batch
        finally:
            # Abandoned while queued (cancelling the wait cancels the future too): it never
            # takes the instance.
            if job.batch.cancelled() or not job.batch.done():
                job.batch.cancel()
                if job in self._prefill_queue:
                    self._prefill_queue.remove(job)
        num_layers = self.cache_spec.num_layers
        outputs = self._outputs(req.request_id, self.layout(n, k))
        last = len(outputs) - 1
        done = False
        try:
            for i, out in enumerate(outputs):
                # The last layer at the batch's end exactly (no rounding past it).
                part = batch.duration_s if i == last else batch.duration_s * (i + 1) / num_layers
                await self.waiter.wait_until(batch.start_s + part)
                if i == last:  # computed: the instance is free of it (before the last send)
                    done = True
                    self._prefill_member_done()
                yield out
        finally:
            if not done:  # abandoned mid-batch: the batch still ends when it was due to
                self._prefill_member_done()
        checkpoints: tuple[CachedPrefix, ...] = ()
        block = req.checkpoint_block_tokens
        if block is not None:
            checkpoints = tuple(
                CachedPrefix(b, tuple(self._outputs(req.request_id, self.layout(b, 0))))
                for b in range((k // block + 1) * block, n + 1, block)
            )
        first = self._draw(_rng(req.request_id, req.sampling), req.sampling, 0)
        yield PrefillResult(req.request_id, first, n, k, checkpoints)

    def _start_prefill_batch(self) -> None:
        """The batcher's next batch from the queue's head starts now (or when the previous one
        ended, if that was a moment ago); its members learn when through their futures."""
        queue = self._prefill_queue
        # A request abandoned while queued has its future cancelled at once, but leaves the
        # queue only when its own task next runs: a batch starting in between (another
        # request's stream closed in the same step) must pass it by, not set its result.
        if any(j.batch.done() for j in queue):
            self._prefill_queue = queue = deque(j for j in queue if not j.batch.done())
        if not queue:
            self._prefill_members_left = 0
            return
        head = [j.num_new_tokens for j in itertools.islice(queue, PREFILL_LOOKAHEAD)]
        plan = self.batcher.next_batch(head)
        jobs = [queue.popleft() for _ in range(plan.num_requests)]
        self._prefill_members_left = len(jobs)
        # One step's fixed cost paid once, as the simulator charges it (in modelled seconds:
        # work_s is clock seconds, time_scale of them).
        scale = self.config.time_scale
        duration = self.cost_model.batched_prefill_s([j.work_s / scale for j in jobs]) * scale
        start = self._start_s(self._prefill_free_at_s)
        self._prefill_free_at_s = start + duration
        batch = PrefillBatchStart(tuple(j.request_id for j in jobs), start, duration)
        for job in jobs:
            job.batch.set_result(batch)
        if self.on_prefill_batch is not None:
            self.on_prefill_batch(batch)

    def _prefill_member_done(self) -> None:
        self._prefill_members_left -= 1
        if self._prefill_members_left == 0 and self._prefill_queue:
            self._start_prefill_batch()  # at the batch's end, as the simulator's PREFILL_DONE

    # -- joining the decode batch -------------------------------------------------------------
    def allocate(self, manifest: ManifestLike, max_new_tokens: int) -> Allocation:
        rid = manifest.request_id
        if rid in self._allocs or rid in self._running or rid in self._waiting:
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
        run = _Running(
            rid, allocation.layout.num_tokens, sampling, 1, _rng(rid, sampling), stop,
            allocation.reserved_bytes,
        )  # fmt: skip
        drawn = self._draw(run.rng, sampling, 0)  # the prefill's first token: same rng stream
        if first_token < 0:  # the sender sampled none (a vLLM prefill server): use the draw
            first_token = drawn
        reason = self._reason(run, first_token)
        if reason is not None:
            self.budget.release(rid)
            return TokenEvent(rid, (first_token,), reason)
        self._waiting[rid] = run  # joins the batch at the next step, if admitted
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
        self._waiting.pop(request_id, None)
        run = self._running.pop(request_id, None)
        if run is not None:
            self._batch_kv_bytes -= run.reserved_bytes
        self.budget.release(request_id)

    # -- decode ---------------------------------------------------------------------------------
    def _admit(self) -> None:
        """At a step boundary: waiting requests join, in order, while ``DecodeAdmission`` lets
        them (the simulator's rule at its decode ticks; the first refused one blocks the rest)."""
        waiting = self._waiting
        while waiting:
            rid, run = next(iter(waiting.items()))
            # A request alone always runs, even one whose KV exceeds the batch's share of HBM
            # (it was allocated, so it fits the instance): refusing it would leave it waiting
            # for ever and the decode loop spinning. The simulator would strand it.
            if self._running and not self.admission.admit_fast(
                len(self._running),
                self._batch_kv_bytes,
                self.decode_kv_capacity_bytes,
                run.reserved_bytes,
            ):
                return
            del waiting[rid]
            self._running[rid] = run
            self._batch_kv_bytes += run.reserved_bytes

    def next_decode_plan(self) -> DecodePlan | None:
        """What the next ``step_async`` will take (None when nothing runs)."""
        self._admit()
        runs = list(self._running.values())
        if not runs:
            return None
        context = sum(r.num_tokens + r.num_generated for r in runs)
        return self.decode_plan(
            context, [r.sampling.max_new_tokens - r.num_generated for r in runs]
        )

    async def step_async(self) -> tuple[TokenEvent, ...]:
        """``token_chunk`` tokens (fewer if a request needs fewer) for each request of the
        batch, after admitting those waiting that ``DecodeAdmission`` lets join."""
        plan = self.next_decode_plan()
        if plan is None:
            return ()
        runs = list(self._running.values())
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
