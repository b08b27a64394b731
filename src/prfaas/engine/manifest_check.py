"""Checking an incoming cache's manifest against this engine's ``CacheSpec``, before any byte lands.

A mismatch (layer count, kind, rows, tensor name, dtype or shape) is refused with a message naming
the first difference. Pure: no torch, no asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.engine.api import ManifestLike
from prfaas.engine.errors import ManifestMismatch
from prfaas.spec import CacheLayout, CacheSpec, DType, LayerSegment, TensorSlice


@dataclass(frozen=True, slots=True)
class LayoutManifest:
    """A manifest made of layout segments (a cached prefix's, or one built locally)."""

    request_id: str
    num_tokens: int
    num_cached_tokens: int
    layers: tuple[LayerSegment, ...]

    @classmethod
    def of(cls, request_id: str, layout: CacheLayout) -> LayoutManifest:
        return cls(request_id, layout.num_tokens, layout.num_cached_tokens, layout.segments)


def check_manifest(
    spec: CacheSpec, manifest: ManifestLike, max_tokens: int, byte_divisor: int = 1
) -> CacheLayout:
    """The (real, unscaled) layout of ``manifest``; ``ManifestMismatch`` if it differs from what
    this spec expects (scaled by ``byte_divisor`` as ``scale_layout`` does, for emulated nodes)."""
    rid = manifest.request_id
    if not 0 < manifest.num_tokens <= max_tokens:
        raise ManifestMismatch(
            f"request {rid}: manifest of {manifest.num_tokens} tokens, this model holds "
            f"1..{max_tokens}"
        )
    try:
        layout = spec.layout(manifest.num_tokens, manifest.num_cached_tokens)
    except ValueError as exc:
        raise ManifestMismatch(f"request {rid}: {exc}") from None
    _compare(rid, manifest, scale_layout(layout, byte_divisor))
    return layout


def _compare(rid: str, manifest: ManifestLike, layout: CacheLayout) -> None:
    if len(manifest.layers) != len(layout.segments):
        raise ManifestMismatch(
            f"request {rid}: manifest has {len(manifest.layers)} layers, "
            f"this model's cache has {len(layout.segments)}"
        )
    for pos, (got, want) in enumerate(zip(manifest.layers, layout.segments, strict=True)):
        where = f"request {rid}, layer {pos}"
        if got.kind is not want.kind:
            raise ManifestMismatch(f"{where}: kind {got.kind.value}, expected {want.kind.value}")
        if got.layer_index != want.layer_index:
            raise ManifestMismatch(
                f"{where}: layer_index {got.layer_index}, expected {want.layer_index}"
            )
        if (got.first_token, got.num_token_rows) != (want.first_token, want.num_token_rows):
            raise ManifestMismatch(
                f"{where}: rows [{got.first_token}, +{got.num_token_rows}), expected "
                f"[{want.first_token}, +{want.num_token_rows})"
            )
        if len(got.tensors) != len(want.tensors):
            raise ManifestMismatch(
                f"{where}: {len(got.tensors)} tensors, expected {len(want.tensors)}"
            )
        for g, w in zip(got.tensors, want.tensors, strict=True):
            if g.name != w.name:
                raise ManifestMismatch(f"{where}: tensor {g.name!r}, expected {w.name!r}")
            if g.dtype is not w.dtype:
                raise ManifestMismatch(
                    f"{where}, tensor {g.name}: dtype {g.dtype.value}, expected {w.dtype.value}"
                )
            if tuple(g.shape) != w.shape:
                raise ManifestMismatch(
                    f"{where}, tensor {g.name}: shape {tuple(g.shape)}, expected {w.shape}"
                )


def scale_layout(layout: CacheLayout, byte_divisor: int) -> CacheLayout:
    """``layout`` with every tensor shrunk to ceil(bytes / divisor) bytes (1-byte elements)."""
    if byte_divisor == 1:
        return layout
    segments = []
    for seg in layout.segments:
        tensors = []
        for t in seg.tensors:
            n = -(-t.num_bytes // byte_divisor)
            tensors.append(TensorSlice(t.name, DType.FP8, (n,), n))
        segments.append(
            LayerSegment(
                seg.layer_index, seg.kind, seg.first_token, seg.num_token_rows, tuple(tensors)
            )
        )
    return CacheLayout(layout.num_tokens, layout.num_cached_tokens, tuple(segments))
