"""Prefill of one request: optionally from a cached prefix, block-aligned state checkpoints, and
each layer's output handed out the moment that layer finishes.

The prompt runs in one forward pass, or, when checkpoints are asked for, in chunks that end on
block boundaries (the state at each boundary is copied as it passes). Layer-wise hand-out happens
in the last pass: a forward hook on each decoder layer exports that layer's share of the cache
(``CacheSpec.layout(num_tokens, num_cached_tokens)``) and passes it to ``on_layer`` before the
next layer starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from prfaas.engine.api import CachedPrefix, LayerOutput, PrefillRequest
from prfaas.engine.hf_spec import HFCacheMap
from prfaas.engine.torch import hf_cache
from prfaas.engine.torch.export import export_layer, prefix_cache
from prfaas.engine.torch.hf_cache import RequestCache
from prfaas.spec import LayerKind


@dataclass(slots=True)
class PrefillOutcome:
    cache: RequestCache
    last_logits: torch.Tensor
    """``[vocab]`` at the last prompt position, fp32."""
    checkpoints: tuple[CachedPrefix, ...]


def _chunk_ends(start: int, end: int, block: int | None) -> list[int]:
    if block is None:
        return [end]
    ends = list(range((start // block + 1) * block, end, block))
    return [*ends, end]


def _snapshot_states(cache: Any, cmap: HFCacheMap) -> dict[int, dict[str, torch.Tensor]]:
    """Copies of the SWA windows and linear states (what a checkpoint needs beyond full KV)."""
    return {
        pos: hf_cache.read_layer(cache, cmap, pos, clone=True)
        for pos, spec in enumerate(cmap.spec.layers)
        if not spec.kind.grows_with_length
    }


def run_prefill(
    model: Any,
    cmap: HFCacheMap,
    req: PrefillRequest,
    max_tokens: int,
    on_layer: Callable[[LayerOutput], None] | None = None,
) -> PrefillOutcome:
    n, k = req.num_tokens, req.num_cached_tokens
    if req.cached is not None:
        start = prefix_cache(cmap, req.cached, max_tokens, model.device)
        cache, _ = hf_cache.build_cache(model, cmap, [start])
    else:
        cache = hf_cache.new_cache(model)
    ids = torch.tensor([req.token_ids], dtype=torch.long)
    ends = _chunk_ends(k, n, req.checkpoint_block_tokens)
    snapshots: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    pos_of = {m: p for p, m in enumerate(cmap.model_layers)}
    logits = None
    begin = k
    for i, end in enumerate(ends):
        last = i == len(ends) - 1
        handles = []
        if last and on_layer is not None:
            handles = hf_cache.after_layers(
                model,
                cache,
                {m: _hand_out(cache, cmap, req, pos, on_layer) for m, pos in pos_of.items()},
            )
        try:
            with torch.inference_mode():
                logits = hf_cache.forward(
                    model, ids[:, begin:end], cache, torch.arange(begin, end).unsqueeze(0)
                )
        finally:
            for h in handles:
                h.remove()
        block = req.checkpoint_block_tokens
        if block is not None and end % block == 0:
            snapshots[end] = _snapshot_states(cache, cmap)
        begin = end
    assert logits is not None
    result = hf_cache.read_request(cache, cmap, n)
    checkpoints = _checkpoints(req.request_id, cmap, result, snapshots)
    return PrefillOutcome(result, logits[0, -1].float(), checkpoints)


def _hand_out(
    cache: Any,
    cmap: HFCacheMap,
    req: PrefillRequest,
    pos: int,
    on_layer: Callable[[LayerOutput], None],
) -> Callable[[], None]:
    def hook() -> None:
        native = hf_cache.read_layer(cache, cmap, pos)
        on_layer(
            export_layer(req.request_id, cmap, pos, native, req.num_tokens, req.num_cached_tokens)
        )

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
