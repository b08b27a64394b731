"""``TorchEngine``: real prefill and decode of a local Hugging Face model on PyTorch.

Holds three tables: caches prefilled here and not yet decoding (``held``: exportable, or started
locally), allocations waiting for an incoming transfer, and the running decode batch. A decode
step combines the running requests' caches into one batch, runs one forward, splits the caches
back and samples one token per request; requests join (``start``/``install``) and leave (finish,
``release``) between steps. KV is accounted in bytes against a budget: a request reserves what its
cache will weigh at its last token, or is refused before anything is allocated.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import torch

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
from prfaas.engine.manifest_check import check_manifest
from prfaas.engine.torch import hf_cache
from prfaas.engine.torch.export import export_cache, import_cache, split_layer_buffer
from prfaas.engine.torch.loader import LoadedModel, load_model
from prfaas.engine.torch.prefill import run_prefill
from prfaas.engine.torch.sampling import choose
from prfaas.spec import CacheLayout, CacheSpec, DType

DEFAULT_KV_BUDGET_BYTES = 4 << 30


@dataclass(slots=True)
class _Running:
    cache: hf_cache.RequestCache
    sampling: SamplingParams
    stop_ids: frozenset[int]
    last_token: int
    num_generated: int


class TorchEngine:
    def __init__(
        self,
        loaded: LoadedModel,
        kv_budget_bytes: int = DEFAULT_KV_BUDGET_BYTES,
        max_batch: int = 64,
    ) -> None:
        self._loaded = loaded
        self._model = loaded.model
        self.cmap = loaded.cmap
        self.budget = KvBudget(kv_budget_bytes)
        self.max_batch = max_batch
        self._held: dict[str, hf_cache.RequestCache] = {}
        self._allocs: dict[str, Allocation] = {}
        self._running: dict[str, _Running] = {}

    @classmethod
    def from_folder(
        cls,
        model_dir: Path | str,
        dtype: DType | str | None = None,
        device: str = "cpu",
        **kwargs: int,
    ) -> TorchEngine:
        dt = DType.parse(dtype) if isinstance(dtype, str) else dtype
        return cls(load_model(model_dir, dt, device=device), **kwargs)

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

    def _reserve_bytes(self, num_tokens: int, max_new_tokens: int) -> int:
        return self.cache_spec.bytes_for(num_tokens + max_new_tokens)

    # -- prefill -------------------------------------------------------------------------------
    def prefill(
        self,
        req: PrefillRequest,
        on_layer: Callable[[LayerOutput], None] | None = None,
        keep: bool = True,
    ) -> PrefillResult:
        """Prefill ``req``; with ``keep`` the engine holds its cache for ``export`` / ``start``
        (``release`` it otherwise).

        ``on_layer`` receives each layer's share of the cache as soon as that layer is computed.
        """
        if req.request_id in self._held or req.request_id in self._running:
            raise EngineError(f"request {req.request_id} is already held by this engine")
        self._check_length(req.request_id, req.num_tokens, req.sampling.max_new_tokens)
        vocab = self._loaded.vocab_size
        bad = [t for t in req.token_ids if not 0 <= t < vocab]
        if bad:
            raise EngineError(f"request {req.request_id}: token id {bad[0]} outside [0, {vocab})")
        out = run_prefill(self._model, self.cmap, req, self.max_context_tokens, on_layer)
        first = choose(out.last_logits, req.sampling, 0)
        if keep:
            self._held[req.request_id] = out.cache
        return PrefillResult(
            req.request_id, first, req.num_tokens, req.num_cached_tokens, out.checkpoints
        )

    async def prefill_stream(
        self, req: PrefillRequest, keep: bool = False
    ) -> AsyncIterator[LayerOutput | PrefillResult]:
        """``prefill`` on a worker thread; yields each ``LayerOutput`` as its layer finishes, then
        the ``PrefillResult``. The event loop stays free to send while later layers compute.
        The cache is not kept afterwards (its layers were handed out) unless ``keep``."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[LayerOutput | PrefillResult | BaseException] = asyncio.Queue()

        def work() -> None:
            def hand_out(out: LayerOutput) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, out)

            try:
                result = self.prefill(req, hand_out, keep)
            except BaseException as exc:  # handed to the awaiting side, re-raised there
                loop.call_soon_threadsafe(queue.put_nowait, exc)
                return
            loop.call_soon_threadsafe(queue.put_nowait, result)

        task = loop.run_in_executor(None, work)
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                await task
                raise item
            yield item
            if isinstance(item, PrefillResult):
                await task
                return

    def export(self, request_id: str, num_cached_tokens: int = 0) -> tuple[LayerOutput, ...]:
        """A held request's cache as it crosses to a node that holds its first
        ``num_cached_tokens`` tokens."""
        return export_cache(request_id, self.cmap, self._held_cache(request_id), num_cached_tokens)

    def _held_cache(self, request_id: str) -> hf_cache.RequestCache:
        cache = self._held.get(request_id)
        if cache is None:
            raise UnknownRequest(f"request {request_id} is not held (prefilled) here")
        return cache

    # -- joining the decode batch -------------------------------------------------------------
    def start(self, result: PrefillResult, sampling: SamplingParams) -> TokenEvent:
        """Decode a request prefilled here. Returns the first token's event."""
        cache = self._held_cache(result.request_id)
        self._check_length(result.request_id, cache.num_tokens, sampling.max_new_tokens)
        self.budget.reserve(
            result.request_id, self._reserve_bytes(cache.num_tokens, sampling.max_new_tokens)
        )
        del self._held[result.request_id]
        return self._join(result.request_id, cache, result.first_token, sampling)

    def allocate(self, manifest: ManifestLike, max_new_tokens: int) -> Allocation:
        """Reserve buffers for an incoming cache, or refuse (mismatch, too long, over budget)."""
        rid = manifest.request_id
        if rid in self._allocs or rid in self._running:
            raise EngineError(f"request {rid} already has a cache here")
        layout = check_manifest(self.cache_spec, manifest, self.max_context_tokens)
        self._check_length(rid, layout.num_tokens, max_new_tokens)
        reserved = self._reserve_bytes(layout.num_tokens, max_new_tokens)
        alloc = self.budget.allocate(rid, layout, reserved)
        self._allocs[rid] = alloc
        return alloc

    def install(
        self,
        allocation: Allocation,
        first_token: int,
        sampling: SamplingParams,
        prefix: CachedPrefix | None = None,
    ) -> TokenEvent:
        """Join the decode batch with a verified transfer (its buffers become the cache: no copy
        unless a cached prefix must be joined). On any error the allocation is released."""
        rid = allocation.request_id
        if self._allocs.get(rid) is not allocation:
            raise UnknownRequest(f"request {rid} has no pending allocation here")
        try:
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
        del self._allocs[rid]
        return self._join(rid, cache, first_token, sampling)

    def _join(
        self, rid: str, cache: hf_cache.RequestCache, first: int, sampling: SamplingParams
    ) -> TokenEvent:
        stop = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop.update(self._loaded.eos_token_ids)
        run = _Running(cache, sampling, frozenset(stop), first, 1)
        reason = self._finish_reason(run, first)
        if reason is None:
            self._running[rid] = run
        else:
            self.budget.release(rid)
        return TokenEvent(rid, (first,), reason)

    @staticmethod
    def _finish_reason(run: _Running, token: int) -> FinishReason | None:
        if token in run.stop_ids:
            return FinishReason.STOP
        if run.num_generated >= run.sampling.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def release(self, request_id: str) -> None:
        """Drop whatever this engine holds for ``request_id`` (held, allocated or running)."""
        self._held.pop(request_id, None)
        self._allocs.pop(request_id, None)
        self._running.pop(request_id, None)
        self.budget.release(request_id)

    # -- decode ---------------------------------------------------------------------------------
    def step(self) -> tuple[TokenEvent, ...]:
        """One decode step for (up to ``max_batch`` of) the running requests.

        Works on a snapshot of the batch, so ``step_async`` (a worker thread) may overlap
        ``install`` / ``release`` on the event loop: joiners wait for the next step."""
        snapshot = list(self._running.items())[: self.max_batch]
        if not snapshot:
            return ()
        ids = [rid for rid, _ in snapshot]
        runs = [run for _, run in snapshot]
        if len(runs) == 1 and self._loaded.batch_invariant:
            runs = runs * 2  # a one-row step takes another GEMM kernel (see hf_cache)
        cache, max_tokens = hf_cache.build_cache(self._model, self.cmap, [r.cache for r in runs])
        lengths = [r.cache.num_tokens for r in runs]
        # Left-padded batch: request b's tokens end at index max_tokens; mask the padding.
        mask = torch.zeros((len(runs), max_tokens + 1), dtype=torch.long)
        for b, n in enumerate(lengths):
            mask[b, max_tokens - n :] = 1
        input_ids = torch.tensor([[r.last_token] for r in runs], dtype=torch.long)
        positions = torch.tensor([[n] for n in lengths], dtype=torch.long)
        with torch.inference_mode():
            logits = hf_cache.forward(self._model, input_ids, cache, positions, mask)
        caches = hf_cache.split_cache(cache, self.cmap, [n + 1 for n in lengths])
        events = []
        for b, (rid, run) in enumerate(zip(ids, runs[: len(ids)], strict=True)):
            run.cache = caches[b]
            token = choose(logits[b, -1].float(), run.sampling, run.num_generated)
            run.num_generated += 1
            run.last_token = token
            reason = self._finish_reason(run, token)
            if reason is not None:
                self._running.pop(rid, None)  # may have been released meanwhile
                self.budget.release(rid)
            events.append(TokenEvent(rid, (token,), reason))
        return tuple(events)

    async def step_async(self) -> tuple[TokenEvent, ...]:
        return await asyncio.to_thread(self.step)

    # -- convenience ----------------------------------------------------------------------------
    def generate(self, req: PrefillRequest) -> list[int]:
        """One-process generation of one request (prefill, then decode alone)."""
        result = self.prefill(req)
        tokens = list(self.start(result, req.sampling).token_ids)
        while req.request_id in self._running:
            for ev in self.step():
                if ev.request_id == req.request_id:
                    tokens.extend(ev.token_ids)
        return tokens


def _conforms(engine: TorchEngine) -> Engine:
    return engine  # mypy checks that TorchEngine offers the whole Engine interface
