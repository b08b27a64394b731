"""A request's cache as wire-layout ``LayerOutput`` s (export) and back (import).

Export follows ``CacheSpec.layout(num_tokens, num_cached_tokens)``: the uncached suffix of
full-attention KV (whole, or one prefill pass's rows of it), the SWA window and the linear states
as of ``num_tokens``. Import makes tensors
over the received buffers without copying where the layout allows (states, a transfer without a
cached prefix); a cached prefix's KV is concatenated with the suffix.
"""

from __future__ import annotations

import torch

from prfaas.engine.api import CachedPrefix, LayerOutput
from prfaas.engine.errors import ManifestMismatch
from prfaas.engine.hf_spec import HFCacheMap
from prfaas.engine.manifest_check import LayoutManifest, check_manifest
from prfaas.engine.torch.hf_cache import (
    RequestCache,
    from_wire,
    layer_spec_names,
    tensor_bytes,
    tensor_from_bytes,
    to_wire,
    torch_dtype,
)
from prfaas.spec import CacheLayout

_CPU = torch.device("cpu")


def export_layer(
    request_id: str,
    cmap: HFCacheMap,
    pos: int,
    native: dict[str, torch.Tensor],
    num_tokens: int,
    num_cached_tokens: int,
) -> LayerOutput:
    """Spec position ``pos`` of a request's cache (``native``: batch-1 tensors) as it crosses."""
    spec = cmap.spec.layers[pos]
    segment = cmap.spec.layout(num_tokens, num_cached_tokens).segments[pos]
    buffers = []
    for name, shape, per_token in layer_spec_names(spec):
        t = native[name]
        if per_token:
            # Native rows hold the last kept_tokens(num_tokens) tokens; take the segment's rows.
            kept = t.shape[-2]
            start = segment.first_token - (num_tokens - kept)
            t = t[:, :, start : start + segment.num_token_rows]
        buffers.append(tensor_bytes(to_wire(t, shape, per_token)))
    return LayerOutput(request_id, pos, segment, tuple(buffers))


def export_rows(
    request_id: str,
    cmap: HFCacheMap,
    pos: int,
    native: dict[str, torch.Tensor],
    num_tokens: int,
    num_cached_tokens: int,
    rows: tuple[int, int],
) -> LayerOutput:
    """KV rows ``[start, end)`` of full-attention spec position ``pos`` (``native``: batch-1
    tensors holding rows ``[0, end)`` at least: a full-attention layer keeps every row) as a part
    of the segment ``CacheSpec.layout(num_tokens, num_cached_tokens)`` gives it."""
    spec = cmap.spec.layers[pos]
    segment = cmap.spec.layout(num_tokens, num_cached_tokens).segments[pos]
    start, end = rows
    buffers = []
    for name, shape, per_token in layer_spec_names(spec):
        t = native[name]
        assert per_token and t.shape[-2] >= end, (name, t.shape, rows)
        buffers.append(tensor_bytes(to_wire(t[:, :, start:end], shape, per_token)))
    return LayerOutput(request_id, pos, segment, tuple(buffers), rows)


def export_cache(
    request_id: str, cmap: HFCacheMap, cache: RequestCache, num_cached_tokens: int = 0
) -> tuple[LayerOutput, ...]:
    return tuple(
        export_layer(request_id, cmap, pos, native, cache.num_tokens, num_cached_tokens)
        for pos, native in enumerate(cache.layers)
    )


def _layer_tensors(
    cmap: HFCacheMap,
    pos: int,
    layout: CacheLayout,
    buffers: tuple[memoryview, ...],
    device: torch.device,
) -> dict[str, torch.Tensor]:
    spec = cmap.spec.layers[pos]
    seg = layout.segments[pos]
    out = {}
    for (name, shape, per_token), sl, buf in zip(
        layer_spec_names(spec), seg.tensors, buffers, strict=True
    ):
        if buf.nbytes != sl.num_bytes:
            raise ManifestMismatch(
                f"layer {pos}, tensor {name}: {buf.nbytes} bytes, expected {sl.num_bytes}"
            )
        wire = tensor_from_bytes(buf, torch_dtype(sl.dtype.value), sl.shape)
        # On CPU a view of the received bytes (no copy); elsewhere one copy to the device.
        out[name] = from_wire(wire, shape, per_token).to(device)
    return out


def split_layer_buffer(layout: CacheLayout, pos: int, buf: memoryview) -> tuple[memoryview, ...]:
    """A layer's contiguous buffer cut into its tensors (views)."""
    views, offset = [], 0
    for t in layout.segments[pos].tensors:
        views.append(buf[offset : offset + t.num_bytes])
        offset += t.num_bytes
    return tuple(views)


def import_cache(
    cmap: HFCacheMap,
    layout: CacheLayout,
    layer_buffers: tuple[tuple[memoryview, ...], ...],
    prefix: CachedPrefix | None,
    max_tokens: int,
    device: torch.device = _CPU,
) -> RequestCache:
    """Rebuild a request's cache from a transfer (and the cached prefix it extends)."""
    k = layout.num_cached_tokens
    prefix_layers: dict[int, dict[str, torch.Tensor]] = {}
    if k > 0:
        if prefix is None or prefix.num_tokens != k:
            got = "none" if prefix is None else f"{prefix.num_tokens} tokens"
            raise ManifestMismatch(f"transfer extends a cached prefix of {k} tokens, got {got}")
        prefix_layout = check_prefix(cmap, prefix, max_tokens)
        for pos, seg in enumerate(layout.segments):
            if seg.kind.grows_with_length:
                bufs = prefix.layers[pos].buffers
                prefix_layers[pos] = _layer_tensors(cmap, pos, prefix_layout, bufs, device)
    layers = []
    for pos, bufs in enumerate(layer_buffers):
        tensors = _layer_tensors(cmap, pos, layout, bufs, device)
        if pos in prefix_layers:
            tensors = {n: torch.cat([prefix_layers[pos][n], t], dim=-2) for n, t in tensors.items()}
        layers.append(tensors)
    return RequestCache(layout.num_tokens, layers)


def check_prefix(cmap: HFCacheMap, prefix: CachedPrefix, max_tokens: int) -> CacheLayout:
    """The layout of a cached prefix, checked against this model's spec."""
    rid = prefix.layers[0].request_id if prefix.layers else "prefix"
    segments = tuple(out.segment for out in prefix.layers)
    return check_manifest(
        cmap.spec, LayoutManifest(rid, prefix.num_tokens, 0, segments), max_tokens
    )


def prefix_cache(
    cmap: HFCacheMap, prefix: CachedPrefix, max_tokens: int, device: torch.device = _CPU
) -> RequestCache:
    """A cached prefix as a ``RequestCache`` (cloned: a prefill updates states in place)."""
    layout = check_prefix(cmap, prefix, max_tokens)
    layers = []
    for pos, out in enumerate(prefix.layers):
        tensors = _layer_tensors(cmap, pos, layout, out.buffers, device)
        layers.append({n: t.clone() for n, t in tensors.items()})
    return RequestCache(prefix.num_tokens, layers)
