"""Prefill of one request as a ``PrefillJob``: a series of forward passes (chunks) that the
engine thread runs one at a time, so a decode step of the running batch can run between two.

Chunks end every ``chunk_tokens`` tokens and on every block boundary when checkpoints are asked
for (the state at each boundary is copied as it passes); a cached prefix means only the suffix is
computed. A pass runs whole chunks up to the next block boundary (or the end) when the engine says
nothing is decoding: cutting then protects no stream and only adds passes.

Layer-wise hand-out happens in every pass: the model's ``LayerTap`` (installed once) is armed with
this job's cache, and as each decoder layer finishes, its share goes to ``on_layer`` before the
next layer starts. A full-attention layer's share of a pass is its new KV rows ``[pass start,
pass end)`` (``LayerOutput.rows``; the whole segment when one pass computes everything), so the
first bytes leave during the first pass, not the last. SWA windows and linear states change until
the last token, so they go whole after the last pass's layer, as
``CacheSpec.layout(num_tokens, num_cached_tokens)`` has them. Every pass holds the model's
``forward_lock``, and is counted on the engine's ``ForwardClock`` with the hand-out left out (what
a profile's curve prices).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from prfaas.engine.api import CachedPrefix, LayerOutput, PrefillRequest
from prfaas.engine.hf_spec import HFCacheMap
from prfaas.engine.torch import hf_cache
from prfaas.engine.torch.export import export_layer, export_rows, prefix_cache
from prfaas.engine.torch.forward_clock import ForwardClock
from prfaas.engine.torch.hf_cache import RequestCache
from prfaas.engine.torch.loader import LoadedModel
from prfaas.perf.prefill_passes import pass_ends
from prfaas.spec import LayerKind


@dataclass(slots=True)
class PrefilledCache:
    cache: RequestCache
    last_logits: torch.Tensor
    """``[vocab]`` at the last prompt position, fp32."""
    checkpoints: tuple[CachedPrefix, ...]


def _snapshot_states(cache: Any, cmap: HFCacheMap) -> dict[int, dict[str, torch.Tensor]]:
    """Copies of the SWA windows and linear states (what a checkpoint needs beyond full KV)."""
    return {
        pos: hf_cache.read_layer(cache, cmap, pos, clone=True)
        for pos, spec in enumerate(cmap.spec.layers)
        if not spec.kind.grows_with_length
    }


class PrefillJob:
    """One request's prefill, one pass per ``run_chunk``; ``result()`` once ``done``."""

    def __init__(
        self,
        loaded: LoadedModel,
        req: PrefillRequest,
        max_tokens: int,
        chunk_tokens: int | None,
        on_layer: Callable[[LayerOutput], None] | None = None,
        clock: ForwardClock | None = None,
    ) -> None:
        self.req = req
        self._loaded = loaded
        self._clock = ForwardClock() if clock is None else clock
        self._max_tokens = max_tokens
        self._on_layer = on_layer
        self._ids = torch.tensor([req.token_ids], dtype=torch.long)
        block = req.checkpoint_block_tokens
        self._ends = pass_ends(req.num_cached_tokens, req.num_tokens, block, chunk_tokens)
        # Where a pass must end even when not split: block boundaries (checkpoints), the end.
        self._marks = set(pass_ends(req.num_cached_tokens, req.num_tokens, block, None))
        self._next = 0
        self._begin = req.num_cached_tokens
        self._cache: Any = None
        self._logits: torch.Tensor | None = None
        self._snapshots: dict[int, dict[int, dict[str, torch.Tensor]]] = {}

    @property
    def done(self) -> bool:
        return self._next == len(self._ends)

    @property
    def num_chunks(self) -> int:
        return len(self._ends)

    def _start_cache(self) -> Any:
        loaded, req = self._loaded, self.req
        if req.cached is None:
            return hf_cache.new_cache(loaded.model)
        start = prefix_cache(loaded.cmap, req.cached, self._max_tokens, loaded.model.device)
        cache, _ = hf_cache.build_cache(loaded.model, loaded.cmap, [start])
        return cache

    def run_chunk(self, split: bool = True) -> None:
        """The next pass: one chunk, or with ``split=False`` every chunk up to the next block
        boundary. Each layer's new KV rows go out as the layer finishes (states: last pass)."""
        if self._cache is None:
            self._cache = self._start_cache()
        loaded, cmap, cache = self._loaded, self._loaded.cmap, self._cache
        i = self._next
        while not split and self._ends[i] not in self._marks:
            i += 1
        end = self._ends[i]
        last = i == len(self._ends) - 1
        tap: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if self._on_layer is not None:
            req = self.req
            whole = self._begin == req.num_cached_tokens and last
            rows = None if whole else (self._begin, end)
            callbacks = {}
            for pos, m in enumerate(cmap.model_layers):
                if cmap.spec.layers[pos].kind.grows_with_length:
                    callbacks[m] = _hand_out(cache, cmap, req, pos, self._on_layer, rows,
                                             self._clock)  # fmt: skip
                elif last:  # a state or window is final only after the last token
                    callbacks[m] = _hand_out(cache, cmap, req, pos, self._on_layer, None,
                                             self._clock)  # fmt: skip
            tap = loaded.tap.armed(cache, callbacks)
        positions = torch.arange(self._begin, end).unsqueeze(0)
        with loaded.forward_lock, torch.inference_mode(), tap, self._clock.timing():
            logits = hf_cache.forward(
                loaded.model, self._ids[:, self._begin : end], cache, positions
            )
        block = self.req.checkpoint_block_tokens
        if block is not None and end % block == 0:
            self._snapshots[end] = _snapshot_states(cache, cmap)
        self._begin = end
        self._next = i + 1
        if last:
            self._logits = logits[0, -1].float()

    def result(self) -> PrefilledCache:
        assert self._logits is not None, "result() before the last chunk ran"
        req, cmap = self.req, self._loaded.cmap
        cache = hf_cache.read_request(self._cache, cmap, req.num_tokens)
        checkpoints = _checkpoints(req.request_id, cmap, cache, self._snapshots)
        return PrefilledCache(cache, self._logits, checkpoints)


def _hand_out(
    cache: Any,
    cmap: HFCacheMap,
    req: PrefillRequest,
    pos: int,
    on_layer: Callable[[LayerOutput], None],
    rows: tuple[int, int] | None,
    clock: ForwardClock,
) -> Callable[[], None]:
    """The tap callback for spec position ``pos``: the whole segment, or KV ``rows`` only (its
    CPU left out of ``clock``'s pass: the curve prices the passes without it)."""

    def hook() -> None:
        with clock.paused():
            native = hf_cache.read_layer(cache, cmap, pos)
            n, k = req.num_tokens, req.num_cached_tokens
            if rows is None:
                on_layer(export_layer(req.request_id, cmap, pos, native, n, k))
            else:
                on_layer(export_rows(req.request_id, cmap, pos, native, n, k, rows))

    return hook


def _checkpoints(
    request_id: str,
    cmap: HFCacheMap,
    final: RequestCache,
    snapshots: dict[int, dict[int, dict[str, torch.Tensor]]],
) -> tuple[CachedPrefix, ...]:
    if not snapshots:
        return ()
    # Full-attention KV is exported once, up to the last checkpoint; each checkpoint's rows are a
    # prefix of it (token-major), so a checkpoint costs its states only, not another KV copy.
    last = max(snapshots)
    full_kv = {
        pos: export_layer(
            request_id,
            cmap,
            pos,
            {n: t[:, :, :last] for n, t in final.layers[pos].items()},
            last,
            0,
        )
        for pos, spec in enumerate(cmap.spec.layers)
        if spec.kind.grows_with_length
    }
    out = []
    for num_tokens, states in sorted(snapshots.items()):
        layers = []
        for pos, spec in enumerate(cmap.spec.layers):
            if pos in full_kv:
                seg = cmap.spec.layout(num_tokens, 0).segments[pos]
                bufs = tuple(
                    buf[: t.num_bytes]
                    for buf, t in zip(full_kv[pos].buffers, seg.tensors, strict=True)
                )
                layers.append(LayerOutput(request_id, pos, seg, bufs))
                continue
            native = states[pos]
            if spec.kind is LayerKind.SWA:
                rows = spec.kept_tokens(num_tokens)
                native = {n: t[:, :, t.shape[-2] - rows :] for n, t in native.items()}
            layers.append(export_layer(request_id, cmap, pos, native, num_tokens, 0))
        out.append(CachedPrefix(num_tokens, tuple(layers)))
    return tuple(out)
