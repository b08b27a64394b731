"""``TorchEngine``: real prefill and decode of a local Hugging Face model on PyTorch.

Every forward pass (prefill chunks and decode steps) runs on the engine's one thread
(``core.EngineLoop``); the asyncio side awaits futures, the blocking API waits on them. Prefills
are cut into passes of ``prefill_chunk_tokens`` while requests decode here, and a waiting decode
step runs between two, so a long prompt does not stall the running streams. A request whose
prefill, decode pass or sampling raises fails alone (``FinishReason.ERROR``); if the thread
itself stops, ``fault`` says why and every pending call fails with ``EngineDead``.

Holds three tables (under one lock, shared by the caller's thread and the engine thread): caches
prefilled here and not yet decoding (``held``: exportable, or started locally), allocations waiting
for an incoming transfer, and the running decode batch. A decode step combines the running
requests' caches into one batch, runs one forward, hands each request its cache a token longer
and samples one token per request (``decode_step.py``; on the CPU into buffers kept between
steps, ``batch_workspace.py``); requests join (``start``/``install``) and leave (finish,
``release``) between steps. KV is accounted in bytes against a budget: a request reserves what its
cache will weigh at its last token, or is refused before anything is allocated.

Owns the tables, their lock, the budget and the public ``Engine`` calls; the work the thread runs
is in ``tasks.py`` (a step, a prefill's chunks), the step itself in ``decode_step.py``, an
unsampled install's rewind in ``unsampled.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prfaas.deployment_sections import TORCH_DECODE_MAX_BATCH
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
from prfaas.engine.errors import EngineDead, EngineError, PromptTooLong, UnknownRequest
from prfaas.engine.manifest_check import check_manifest
from prfaas.engine.torch import hf_cache
from prfaas.engine.torch.batch_workspace import BatchWorkspace
from prfaas.engine.torch.core import EngineLoop, Task
from prfaas.engine.torch.decode_step import (
    Running,
    Stepped,
    finish_reason,
    forward_step,
    isolate,
    sample_tokens,
)
from prfaas.engine.torch.export import export_cache, import_cache, split_layer_buffer
from prfaas.engine.torch.forward_clock import ForwardClock
from prfaas.engine.torch.loader import LoadedModel, load_model
from prfaas.engine.torch.prefill import PrefillJob
from prfaas.engine.torch.sampling import choose, seen_mask
from prfaas.engine.torch.tasks import PrefillTask, StepTask
from prfaas.engine.torch.unsampled import before_last_token
from prfaas.spec import CacheLayout, CacheSpec, DType

DEFAULT_KV_BUDGET_BYTES = 4 << 30
DEFAULT_PREFILL_CHUNK_TOKENS = 512
"""Longest prefill pass while requests decode on the engine: a decode step of the running batch
waits at most one such pass. Smaller costs prefill speed (more, shorter passes) for smoother
streams; None runs a prompt in one pass. With nothing decoding, passes are not cut."""
DEFAULT_MAX_BATCH = TORCH_DECODE_MAX_BATCH
"""Requests one decode step holds; more running ones take turns (round robin). Whatever the
steps take: this engine admits by its KV budget, not by a decode SLO. Defined beside the
simulator's engine kinds (``deployment_sections``), which model this engine with it."""
_names = itertools.count()


@dataclass(slots=True)
class _Held:
    cache: hf_cache.RequestCache
    prompt_token_ids: tuple[int, ...]


class TorchEngine:
    def __init__(
        self,
        loaded: LoadedModel,
        kv_budget_bytes: int = DEFAULT_KV_BUDGET_BYTES,
        max_batch: int = DEFAULT_MAX_BATCH,
        prefill_chunk_tokens: int | None = DEFAULT_PREFILL_CHUNK_TOKENS,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_chunk_tokens is not None and prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
        self._loaded = loaded
        self._model = loaded.model
        self.cmap = loaded.cmap
        self.budget = KvBudget(kv_budget_bytes)
        self.max_batch = max_batch
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._prefilling: set[str] = set()
        self._allocs: dict[str, Allocation] = {}
        self._running: dict[str, Running] = {}
        # The decode step's gather buffers, kept between steps (engine thread only). On the CPU
        # only: there the fresh blocks page-faulted every step (batch_workspace.py); on a GPU the
        # caching allocator reuses blocks already, and a kept buffer would only hold memory.
        self._workspace = BatchWorkspace() if loaded.model.device.type == "cpu" else None
        self._loop = EngineLoop(f"prfaas-engine-{next(_names)}")
        self._forward_clock = ForwardClock()  # the engine thread's own passes only
        # The loop thread holds no reference to this engine: once nobody does, stop it.
        weakref.finalize(self, self._loop.stop_soon)

    @classmethod
    def from_folder(
        cls,
        model_dir: Path | str,
        dtype: DType | str | None = None,
        device: str = "cpu",
        **kwargs: Any,
    ) -> TorchEngine:
        dt = DType.parse(dtype) if isinstance(dtype, str) else dtype
        return cls(load_model(model_dir, dt, device=device), **kwargs)

    # -- life cycle ----------------------------------------------------------------------------
    @property
    def fault(self) -> str:
        """Why the engine thread stopped ("" while it serves)."""
        return self._loop.fault

    @property
    def engine_cpu_s(self) -> float:
        """CPU seconds the engine thread has spent in forward passes (with their sampling and
        layer hand-off) since it started (``core.EngineLoop.slice_cpu_s``)."""
        return self._loop.slice_cpu_s

    @property
    def forward_cpu_s(self) -> float:
        """CPU seconds the engine thread has spent in the model's forward passes alone (the
        layer hand-out, sampling, cache copies left out: what a profile's curves price) since it
        started (``forward_clock``)."""
        return self._forward_clock.total_s

    def close(self) -> None:
        """Stop the engine thread and join it; pending calls fail with ``EngineDead``."""
        self._loop.close()

    def __enter__(self) -> TorchEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_alive(self) -> None:
        if self._loop.stopped:
            raise EngineDead(self._loop.fault)

    def _wait(self, task: Task) -> Any:
        """Blocking callers: run ``task`` on the engine thread and wait for it."""
        if self._loop.on_loop_thread():
            task.fail(EngineError("a blocking engine call from the engine thread would deadlock"))
        else:
            self._submit(task)
        return task.future.result()

    def _submit(self, task: Task) -> None:
        try:
            self._loop.submit(task)
        except EngineDead as exc:
            task.fail(exc)  # frees what the task reserved (a prefill's request id)
            raise

    # -- what this engine is -----------------------------------------------------------------
    @property
    def cache_spec(self) -> CacheSpec:
        return self.cmap.spec

    @property
    def max_context_tokens(self) -> int:
        return self.cmap.max_context_tokens

    @property
    def num_running(self) -> int:
        return len(self._running)

    def running_ids(self) -> tuple[str, ...]:
        return tuple(self._running)

    def layout(self, num_tokens: int, num_cached_tokens: int = 0) -> CacheLayout:
        """What crosses for a request of ``num_tokens`` whose receiver holds the first
        ``num_cached_tokens``."""
        return self.cache_spec.layout(num_tokens, num_cached_tokens)

    def _check_length(self, request_id: str, num_tokens: int, max_new_tokens: int) -> None:
        if num_tokens + max_new_tokens > self.max_context_tokens:
            raise PromptTooLong(
                f"request {request_id}: {num_tokens} prompt tokens + {max_new_tokens} new tokens "
                f"exceed the model's maximum of {self.max_context_tokens}"
            )

    # -- prefill -------------------------------------------------------------------------------
    def _stop_ids(self, sampling: SamplingParams) -> frozenset[int]:
        stop = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop.update(self._loaded.eos_token_ids)
        return frozenset(stop)

    def _seen(self, sampling: SamplingParams, token_ids: Sequence[int]) -> torch.Tensor | None:
        if sampling.repetition_penalty == 1.0:
            return None
        return seen_mask(self._loaded.vocab_size, token_ids)

    def _prefill_task(
        self, req: PrefillRequest, on_layer: Callable[[LayerOutput], None] | None, keep: bool
    ) -> PrefillTask:
        """Check ``req`` here (a refusal is immediate) and make its task for the engine thread."""
        rid = req.request_id
        self._check_length(rid, req.num_tokens, req.sampling.max_new_tokens)
        vocab = self._loaded.vocab_size
        bad = [t for t in req.token_ids if not 0 <= t < vocab]
        if bad:
            raise EngineError(f"request {rid}: token id {bad[0]} outside [0, {vocab})")
        with self._lock:
            if rid in self._held or rid in self._running or rid in self._prefilling:
                raise EngineError(f"request {rid} is already held by this engine")
            self._prefilling.add(rid)

        def make() -> PrefillJob:
            return PrefillJob(
                self._loaded,
                req,
                self.max_context_tokens,
                self.prefill_chunk_tokens,
                on_layer,
                self._forward_clock,
            )

        def finish(task: PrefillTask, job: PrefillJob) -> PrefillResult:
            out = job.result()
            seen = self._seen(req.sampling, req.token_ids)
            first = choose(out.last_logits, req.sampling, 0, self._stop_ids(req.sampling), seen)
            with self._lock:  # with _abandon's lock: a cancelled stream never leaves it held
                self._prefilling.discard(rid)
                if keep and not task.cancelled:
                    self._held[rid] = _Held(out.cache, req.token_ids)
            return PrefillResult(rid, first, req.num_tokens, req.num_cached_tokens, out.checkpoints)

        return PrefillTask(make, finish, self._forget_prefill, rid, self._decoding)

    def _decoding(self) -> bool:
        """Cut prefills into chunks only while requests decode here (there are streams to keep
        going); otherwise a pass runs to the next block boundary, for the layer-wise overlap."""
        return bool(self._running)

    def _forget_prefill(self, request_id: str) -> None:
        with self._lock:
            self._prefilling.discard(request_id)

    def prefill(
        self,
        req: PrefillRequest,
        on_layer: Callable[[LayerOutput], None] | None = None,
        keep: bool = True,
    ) -> PrefillResult:
        """Prefill ``req`` on the engine thread and wait; with ``keep`` the engine holds its cache
        for ``export`` / ``start`` (``release`` it otherwise).

        ``on_layer`` receives each layer's share of the cache as soon as that layer is computed
        (on the engine thread)."""
        result: PrefillResult = self._wait(self._prefill_task(req, on_layer, keep))
        return result

    async def prefill_stream(
        self, req: PrefillRequest, keep: bool = False
    ) -> AsyncIterator[LayerOutput | PrefillResult]:
        """Yields each ``LayerOutput`` as its layer finishes on the engine thread, then the
        ``PrefillResult``; the event loop stays free to send while later layers compute. Leaving
        the iteration early cancels the prefill at its next chunk boundary. The cache is not kept
        afterwards (its layers were handed out) unless ``keep``."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[LayerOutput | None] = asyncio.Queue()

        def on_layer(out: LayerOutput) -> None:
            loop.call_soon_threadsafe(items.put_nowait, out)

        task = self._prefill_task(req, on_layer, keep)
        # Posted after the last layer (same thread, same order): None means "the future is set".
        task.future.add_done_callback(lambda _: loop.call_soon_threadsafe(items.put_nowait, None))
        self._submit(task)
        finished = False
        try:
            while (item := await items.get()) is not None:
                yield item
            result: PrefillResult = task.future.result()  # the engine's error, if it failed
            finished = True
            yield result
        finally:
            if not finished:
                self._abandon(task, keep)

    def _abandon(self, task: PrefillTask, keep: bool) -> None:
        with self._lock:
            task.cancel()
            future = task.future
            if keep and future.done() and not future.cancelled() and future.exception() is None:
                self._held.pop(task.request_id, None)

    def export(self, request_id: str, num_cached_tokens: int = 0) -> tuple[LayerOutput, ...]:
        """A held request's cache as it crosses to a node that holds its first
        ``num_cached_tokens`` tokens."""
        return export_cache(request_id, self.cmap, self._held_cache(request_id), num_cached_tokens)

    def _held_cache(self, request_id: str) -> hf_cache.RequestCache:
        return self._held_entry(request_id).cache

    def _held_entry(self, request_id: str) -> _Held:
        held = self._held.get(request_id)
        if held is None:
            raise UnknownRequest(f"request {request_id} is not held (prefilled) here")
        return held

    # -- joining the decode batch -------------------------------------------------------------
    def start(self, result: PrefillResult, sampling: SamplingParams) -> TokenEvent:
        """Decode a request prefilled here. Returns the first token's event."""
        rid = result.request_id
        self._check_alive()
        with self._lock:
            held = self._held_entry(rid)
            self._check_length(rid, held.cache.num_tokens, sampling.max_new_tokens)
            self.budget.reserve(rid, self._reserve_bytes(held.cache.num_tokens, sampling))
            del self._held[rid]
            return self._join(rid, held.cache, result.first_token, sampling, held.prompt_token_ids)

    def allocate(self, manifest: ManifestLike, max_new_tokens: int) -> Allocation:
        """Reserve buffers for an incoming cache, or refuse (mismatch, too long, over budget)."""
        rid = manifest.request_id
        self._check_alive()
        layout = check_manifest(self.cache_spec, manifest, self.max_context_tokens)
        self._check_length(rid, layout.num_tokens, max_new_tokens)
        reserved = self.cache_spec.bytes_for(layout.num_tokens + max_new_tokens)
        with self._lock:
            if rid in self._allocs or rid in self._running:
                raise EngineError(f"request {rid} already has a cache here")
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
        """Join the decode batch with a verified transfer (its buffers become the cache: no copy
        unless a cached prefix must be joined). On any error the allocation is released.
        ``prompt_token_ids`` feed the repetition penalty (without them it sees the output only).
        ``first_token`` < 0: the sender sampled none; the last prompt token is run here and the
        first token comes with the next step (needs ``prompt_token_ids``; the event has none)."""
        rid = allocation.request_id
        with self._lock:
            if self._allocs.get(rid) is not allocation:
                raise UnknownRequest(f"request {rid} has no pending allocation here")
        try:
            self._check_alive()
            layout = allocation.layout
            per_layer = tuple(
                split_layer_buffer(layout, pos, buf)
                for pos, buf in enumerate(allocation.layer_buffers)
            )
            cache = import_cache(
                self.cmap, layout, per_layer, prefix, self.max_context_tokens, self._model.device
            )
        except BaseException:
            self.release(rid)
            raise
        if first_token < 0:  # the sender sampled none (a vLLM prefill server): compute it here
            try:
                cache, last = before_last_token(cache, layout, prompt_token_ids, rid)
            except BaseException:
                self.release(rid)
                raise
        with self._lock:
            if self._allocs.pop(rid, None) is not allocation:  # released meanwhile
                raise UnknownRequest(f"request {rid} was released before it was installed")
            if first_token < 0:
                return self._join_unsampled(rid, cache, last, sampling, prompt_token_ids)
            return self._join(rid, cache, first_token, sampling, prompt_token_ids)

    def _join(
        self,
        rid: str,
        cache: hf_cache.RequestCache,
        first: int,
        sampling: SamplingParams,
        prompt_token_ids: Sequence[int],
    ) -> TokenEvent:
        """(Under the lock.) The request's first token is out: run it, or finish it now."""
        seen = self._seen(sampling, prompt_token_ids)
        if seen is not None and 0 <= first < seen.shape[0]:
            seen[first] = True
        run = Running(cache, sampling, self._stop_ids(sampling), first, 1, seen)
        reason = finish_reason(run, first)
        if reason is None:
            self._running[rid] = run
        else:
            self.budget.release(rid)
        return TokenEvent(rid, (first,), reason)

    def _join_unsampled(
        self,
        rid: str,
        cache: hf_cache.RequestCache,
        last_prompt_token: int,
        sampling: SamplingParams,
        prompt_token_ids: Sequence[int],
    ) -> TokenEvent:
        """(Under the lock.) Join with the last prompt token still to run: the next decode step
        feeds it at position ``cache.num_tokens`` and samples the first token from its logits
        (as vLLM's own decode server does with a remote prefill). No token out yet."""
        seen = self._seen(sampling, prompt_token_ids)
        stop = self._stop_ids(sampling)
        self._running[rid] = Running(cache, sampling, stop, last_prompt_token, 0, seen)
        return TokenEvent(rid, ())

    def _reserve_bytes(self, num_tokens: int, sampling: SamplingParams) -> int:
        return self.cache_spec.bytes_for(num_tokens + sampling.max_new_tokens)

    def release(self, request_id: str) -> None:
        """Drop whatever this engine holds for ``request_id`` (held, allocated or running)."""
        with self._lock:
            self._held.pop(request_id, None)
            self._allocs.pop(request_id, None)
            self._running.pop(request_id, None)
            self.budget.release(request_id)

    # -- decode ---------------------------------------------------------------------------------
    def step(self) -> tuple[TokenEvent, ...]:
        """One decode step (on the engine thread) for up to ``max_batch`` running requests."""
        events: tuple[TokenEvent, ...] = self._wait(StepTask(self._step_now))
        return events

    async def step_async(self) -> tuple[TokenEvent, ...]:
        """``step`` awaited from the event loop: it runs between two prefill chunks."""
        task = StepTask(self._step_now)
        self._submit(task)
        events: tuple[TokenEvent, ...] = await asyncio.wrap_future(task.future)
        return events

    def _step_now(self) -> tuple[TokenEvent, ...]:
        """(Engine thread.) Works on a snapshot of the batch: ``install`` / ``release`` on
        another thread meanwhile take effect at the next step."""
        with self._lock:
            batch = list(self._running.items())[: self.max_batch]
            if len(self._running) > self.max_batch:  # round robin: the rest go first next time
                for rid, run in batch:
                    del self._running[rid]
                    self._running[rid] = run
        if not batch:
            return ()
        runs = [run for _, run in batch]
        try:
            stepped: list[Stepped | Exception] = list(self._forward_step(runs))
        except Exception as exc:
            stepped = isolate(self._forward_step, runs, exc)
        events = sample_tokens(batch, stepped)
        with self._lock:
            live = []
            for (rid, run), event in zip(batch, events, strict=True):
                if self._running.get(rid) is not run:
                    continue  # released meanwhile: nobody wants its tokens
                if event.finished:
                    del self._running[rid]
                    self.budget.release(rid)
                live.append(event)
            idle = not self._running
        if idle and self._workspace is not None:
            self._workspace.clear()  # the last request left: give the gather buffers back
        return tuple(live)

    def _forward_step(self, runs: list[Running]) -> list[Stepped]:
        """One batched decode forward (``decode_step.forward_step``): a method of its own, the
        one place a step reaches the model (tests break it here)."""
        return forward_step(self._loaded, self.cmap, runs, self._workspace, self._forward_clock)

    # -- convenience ----------------------------------------------------------------------------
    def generate(self, req: PrefillRequest) -> list[int]:
        """One-process generation of one request (prefill, then decode alone)."""
        result = self.prefill(req)
        tokens = list(self.start(result, req.sampling).token_ids)
        while req.request_id in self._running:
            for ev in self.step():
                if ev.request_id == req.request_id:
                    if ev.finish_reason is FinishReason.ERROR:
                        raise EngineError(ev.error)
                    tokens.extend(ev.token_ids)
        return tokens


def _conforms(engine: TorchEngine) -> Engine:
    return engine  # mypy checks that TorchEngine offers the whole Engine interface
