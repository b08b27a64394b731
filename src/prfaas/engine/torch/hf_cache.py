"""Every touch of transformers internals lives here (transformers pinned at 5.24.0).

What this module knows and nobody else should: the ``cache=`` forward argument (5.24 renamed it
from ``past_key_values``), the cache layer classes and their fields (``keys``/``values``,
``cumulative_length`` of sliding-window layers, ``conv_states``/``recurrent_states`` and the
``has_previous_state`` flag of linear layers, which must be set again when a cache is rebuilt or
the next step is taken for a new prefill), what an attention layer's ``update`` returns (so a
decode step may write its token in place, ``build_cache`` with a workspace), where the decoder
layers are, and how a model's cache tensors map to the spec's tensor names, and the decoder-layer
hooks (``LayerTap``, installed once).

A request's cache is kept as a ``RequestCache``: per spec position, the spec's tensor names mapped
to tensors in the model's native layout with a batch axis of 1 (``[1, heads, tokens, dim]`` for
attention, ``[1, *state]`` for linear layers). Decode steps combine several into one batched
``DynamicCache`` (attention left-padded, right-aligned, so sliding windows line up) and, after
the step, split it back into views (``split_cache``, a GPU's step) or append each request's new
rows to a buffer of its own (``append_step``, a CPU's step over kept buffers: nothing allocated).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicSlidingWindowLayer

from prfaas.engine.hf_spec import HFCacheMap
from prfaas.engine.torch.batch_workspace import BatchWorkspace
from prfaas.spec import LayerCache, LayerKind

_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Spec tensor name -> attribute of a transformers attention cache layer.
_ATTN_FIELDS = {"k": "keys", "v": "values", "kv_latent": "keys", "k_rope": "values"}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


@dataclass(slots=True)
class RequestCache:
    """One request's cache: per spec position, tensor name -> native tensor (batch axis 1)."""

    num_tokens: int
    layers: list[dict[str, torch.Tensor]]
    room: dict[tuple[int, str], tuple[torch.Tensor, int]] = field(default_factory=dict)
    """Where decode steps append in place (``append_step``): per (spec position, attention
    tensor name), a buffer ``[1, heads, capacity, dim]`` and the index that position's tensor in
    ``layers`` ends at (it is a view of the buffer). Shared with the cache this one was appended
    from, which sees none of the rows past its own end; empty until the first such step."""


def decoder_layers(model: PreTrainedModel) -> list[torch.nn.Module]:
    return list(model.model.layers)


# Batch invariance (bf16/fp16 on CPU): a request must get the same tokens whatever its batch-mates.
# Measured here: a bf16 GEMM gives the same row whatever the row count M >= 2, but M = 1 takes
# another kernel (rarely 1 ulp off); fp32 GEMMs change with M everywhere. Hence: the engine never
# runs a one-row decode step (it duplicates the row); MoE experts run one token at a time
# (transformers' "batched_mm": a bmm per token, invariant); routers that compute in fp32 inside a
# bf16 model (Kimi Linear, NemotronH) route one token at a time.
_FP32_ROUTERS = ("KimiLinearTopkRouter", "NemotronHTopkRouter")
BATCH_INVARIANT_EXPERTS = "batched_mm"


def make_routing_batch_invariant(model: PreTrainedModel) -> int:
    """Wrap fp32 routers to route row by row; returns how many."""
    count = 0
    for module in model.modules():
        if type(module).__name__ in _FP32_ROUTERS:
            hidden_dim: Any = module.hidden_dim
            module.forward = _row_by_row(module.forward, int(hidden_dim))
            count += 1
    return count


def _row_by_row(forward: Any, hidden_dim: int) -> Any:
    def routed(hidden_states: torch.Tensor) -> Any:
        rows = hidden_states.reshape(-1, hidden_dim)
        if rows.shape[0] == 1:
            return forward(rows)
        parts = [forward(rows[i : i + 1]) for i in range(rows.shape[0])]
        return tuple(torch.cat(p) for p in zip(*parts, strict=True))

    return routed


class LayerTap:
    """Forward hooks installed once on every decoder layer of a model, never per request: adding
    or removing hooks while another thread runs a forward is what broke concurrent prefills
    (``hook() missing ... '_output'``), and a per-request hook fired inside another request's pass.

    A hook acts only on the thread that armed the tap and only for a forward over the cache it
    armed with: ``callbacks[m]()`` runs as soon as decoder layer ``m`` has filled that cache.
    Any other pass (a decode step between prefill chunks, another engine sharing the model, a test
    calling the model directly) goes through untouched."""

    def __init__(self, model: PreTrainedModel) -> None:
        self._local = threading.local()
        self._handles = [
            layer.register_forward_hook(self._hook_for(m), with_kwargs=True)
            for m, layer in enumerate(decoder_layers(model))
        ]

    def _hook_for(self, m: int) -> Callable[..., None]:
        def hook(_module: Any, _args: Any, kwargs: dict[str, Any], _output: Any) -> None:
            armed: tuple[DynamicCache, dict[int, Callable[[], None]]] | None = getattr(
                self._local, "armed", None
            )
            if armed is not None and kwargs.get("cache") is armed[0]:
                callback = armed[1].get(m)
                if callback is not None:
                    callback()

        return hook

    @contextmanager
    def armed(
        self, cache: DynamicCache, callbacks: dict[int, Callable[[], None]]
    ) -> Iterator[None]:
        """Within this block, forwards of this thread over ``cache`` call ``callbacks``."""
        if getattr(self._local, "armed", None) is not None:
            raise RuntimeError("layer tap already armed on this thread")
        self._local.armed = (cache, callbacks)
        try:
            yield
        finally:
            self._local.armed = None


def new_cache(model: PreTrainedModel) -> DynamicCache:
    return DynamicCache(config=model.config)


def load_pretrained(path: Any, dtype: torch.dtype, batch_invariant: bool) -> PreTrainedModel:
    """``from_pretrained``; MoE experts token by token when ``batch_invariant``."""
    if batch_invariant:
        try:
            model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, experts_implementation=BATCH_INVARIANT_EXPERTS
            )
            return model
        except (ValueError, KeyError, TypeError):
            pass  # no experts in this architecture
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model


def forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    cache: DynamicCache,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    last_only: bool = True,
) -> torch.Tensor:
    """Logits ``[batch, q, vocab]`` (only the last position if ``last_only``); fills ``cache``."""
    device = model.device
    out = model(
        input_ids=input_ids.to(device),
        attention_mask=None if attention_mask is None else attention_mask.to(device),
        position_ids=position_ids.to(device),
        cache=cache,
        use_cache=True,
        logits_to_keep=1 if last_only else 0,
    )
    logits: torch.Tensor = out.logits
    return logits


def _native_layer(cache: DynamicCache, model_layer: int) -> Any:
    return cache.layers[model_layer]


def read_layer(
    cache: DynamicCache, cmap: HFCacheMap, pos: int, clone: bool = False
) -> dict[str, torch.Tensor]:
    """Spec position ``pos`` of a batch cache: name -> native tensor (all batch rows)."""
    layer = _native_layer(cache, cmap.model_layers[pos])
    spec = cmap.spec.layers[pos]
    out: dict[str, torch.Tensor] = {}
    if spec.kind is LayerKind.LINEAR:
        out["recurrent_state"] = layer.recurrent_states[0]
        out["conv_state"] = layer.conv_states[0]
    else:
        for t in spec.per_token:
            out[t.name] = getattr(layer, _ATTN_FIELDS[t.name])
    return {k: v.clone() for k, v in out.items()} if clone else out


def read_request(cache: DynamicCache, cmap: HFCacheMap, num_tokens: int) -> RequestCache:
    """A batch-1 cache as a ``RequestCache`` (no copies: the cache is not used again)."""
    return RequestCache(
        num_tokens, [read_layer(cache, cmap, p) for p in range(cmap.spec.num_layers)]
    )


def _fill_attention(layer: Any, k: torch.Tensor, v: torch.Tensor, num_tokens: int) -> None:
    layer.lazy_initialization(k, v)
    layer.keys, layer.values = k, v
    if isinstance(layer, DynamicSlidingWindowLayer):
        layer.cumulative_length = num_tokens


def _fill_linear(layer: Any, conv: torch.Tensor, state: torch.Tensor) -> None:
    layer.device, layer.dtype = conv.device, conv.dtype
    layer.conv_states[0], layer.recurrent_states[0] = conv, state
    layer.conv_kernel_size[0] = conv.shape[-1]
    layer.is_conv_states_initialized[0] = layer.is_recurrent_states_initialized[0] = True
    # Without this the next forward is taken for a fresh prefill and the state is ignored.
    layer.has_previous_state[0] = True


def _left_pad(t: torch.Tensor, rows: int) -> torch.Tensor:
    """Pad the token axis (-2) of ``[1, heads, tokens, dim]`` on the left up to ``rows``."""
    missing = rows - t.shape[-2]
    if missing == 0:
        return t
    pad = t.new_zeros((*t.shape[:-2], missing, t.shape[-1]))
    return torch.cat([pad, t], dim=-2)


def build_cache(
    model: PreTrainedModel,
    cmap: HFCacheMap,
    requests: list[RequestCache],
    workspace: BatchWorkspace | None = None,
) -> tuple[DynamicCache, int]:
    """One batched cache for ``requests`` (fresh tensors: the step may update states in place).

    Attention rows are left-padded so every request's last token sits at the same index ``T - 1``
    (``T`` = the longest); the caller masks the padding and passes each request's own positions.
    With a ``workspace``, the attention rows are gathered into its kept buffers rather than fresh
    ones, with a column to spare that the step's one-token forward writes in place
    (``_write_in_place``); ``append_step`` then copies each request's new row out, so the buffers
    are free again for the next step. Returns the cache and ``T``.
    """
    cache = new_cache(model)
    max_tokens = max(r.num_tokens for r in requests)
    for pos, spec in enumerate(cmap.spec.layers):
        layer = _native_layer(cache, cmap.model_layers[pos])
        if spec.kind is LayerKind.LINEAR:
            conv = torch.cat([r.layers[pos]["conv_state"] for r in requests])
            state = torch.cat([r.layers[pos]["recurrent_state"] for r in requests])
            _fill_linear(layer, conv, state)
            continue
        names = [t.name for t in spec.per_token]
        rows = spec.kept_tokens(max_tokens)
        if workspace is None:
            k, v = (torch.cat([_left_pad(r.layers[pos][n], rows) for r in requests]) for n in names)
            _fill_attention(layer, k, v, max_tokens)
        else:
            k, v = (_gather_left_padded(workspace, pos, n, requests, rows) for n in names)
            _fill_attention(layer, k[:, :, :rows], v[:, :, :rows], max_tokens)
            _write_in_place(layer, k, v, rows)
    return cache, max_tokens


def _gather_left_padded(
    workspace: BatchWorkspace, pos: int, name: str, requests: list[RequestCache], rows: int
) -> torch.Tensor:
    """The requests' ``[1, heads, tokens, dim]`` left-padded to ``rows`` into the workspace's
    buffer for (``pos``, ``name``), of ``rows + 1`` tokens: the last for the step's own."""
    first = requests[0].layers[pos][name]
    shape = (len(requests), first.shape[1], rows + 1, first.shape[-1])
    out = workspace.tensor((pos, name), shape, first)
    for b, r in enumerate(requests):
        t = r.layers[pos][name]
        start = rows - t.shape[-2]
        out[b, :, :start].zero_()
        out[b, :, start:rows].copy_(t[0])
    return out


def _write_in_place(layer: Any, keys: torch.Tensor, values: torch.Tensor, rows: int) -> None:
    """This layer's next one-token ``update`` writes the token into column ``rows`` of ``keys`` /
    ``values`` (gathered up to it) and returns them whole: the tensors the class's own update
    would return (``torch.cat`` of the same rows), without allocating them."""
    cls_update = type(layer).update

    def update(key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kw: Any) -> Any:
        if key_states.shape[-2] != 1 or getattr(layer, "record_past", False):
            return cls_update(layer, key_states, value_states, *args, **kw)
        keys[:, :, rows] = key_states[:, :, 0]
        values[:, :, rows] = value_states[:, :, 0]
        layer.keys, layer.values = keys, values
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length += 1
        return keys, values

    layer.update = update


def append_step(
    cache: DynamicCache,
    cmap: HFCacheMap,
    requests: list[RequestCache],
    remaining_tokens: list[int],
) -> list[RequestCache]:
    """After a step over ``build_cache(..., workspace)``: each request's cache one token longer,
    its new attention rows appended in place to its own buffer (``RequestCache.room``) rather than
    left as views of the batch. A request without room (or outgrown it) gets a buffer for its
    ``remaining_tokens`` more, so it is allocated once (a window's layers: a window more at a
    time); the pages not yet written cost nothing."""
    natives = [read_layer(cache, cmap, pos) for pos in range(cmap.spec.num_layers)]
    out: list[RequestCache] = []
    for b, req in enumerate(requests):
        n = req.num_tokens + 1
        layers: list[dict[str, torch.Tensor]] = []
        room = dict(req.room)
        for pos, (spec, native) in enumerate(zip(cmap.spec.layers, natives, strict=True)):
            if spec.kind is LayerKind.LINEAR:
                layers.append({k: t[b : b + 1] for k, t in native.items()})
                continue
            kept, grown = spec.kept_tokens(n), {}
            # A window keeps its last tokens only: room for a window more at a time (a copy of
            # the window each time it fills), not for the whole generation, which would hold it.
            more = remaining_tokens[b]
            if spec.window_tokens is not None:
                more = min(more, spec.window_tokens)
            for name, t in native.items():
                view, room[pos, name] = _append_row(
                    req.layers[pos][name], t[b : b + 1, :, -1], room.get((pos, name)), kept, more
                )  # fmt: skip
                grown[name] = view
            layers.append(grown)
        out.append(RequestCache(n, layers, room))
    return out


def _append_row(
    current: torch.Tensor,
    row: torch.Tensor,
    room: tuple[torch.Tensor, int] | None,
    kept: int,
    more: int,
) -> tuple[torch.Tensor, tuple[torch.Tensor, int]]:
    """``current`` ``[1, heads, m, dim]`` with ``row`` ``[1, heads, dim]`` after it, the last
    ``kept`` tokens: a view of ``room``'s buffer where ``current`` is its tail and there is room."""
    m = current.shape[-2]
    if room is not None:
        buf, end = room
        if end < buf.shape[-2] and m <= end and current.data_ptr() == buf[:, :, end - m].data_ptr():
            buf[:, :, end] = row
            return buf[:, :, end + 1 - kept : end + 1], (buf, end + 1)
    buf = current.new_empty((1, current.shape[1], m + 1 + max(more, 0), current.shape[-1]))
    buf[:, :, :m] = current
    buf[:, :, m] = row
    return buf[:, :, m + 1 - kept : m + 1], (buf, m + 1)


def split_cache(cache: DynamicCache, cmap: HFCacheMap, num_tokens: list[int]) -> list[RequestCache]:
    """Undo ``build_cache`` after a step: request ``b`` now holds ``num_tokens[b]`` tokens."""
    out = [RequestCache(n, []) for n in num_tokens]
    for pos, spec in enumerate(cmap.spec.layers):
        native = read_layer(cache, cmap, pos)
        for b, req in enumerate(out):
            rows = spec.kept_tokens(req.num_tokens)
            if spec.kind is LayerKind.LINEAR:
                req.layers.append({k: t[b : b + 1] for k, t in native.items()})
            else:
                req.layers.append(
                    {k: t[b : b + 1, :, t.shape[-2] - rows :] for k, t in native.items()}
                )
    return out


# -- wire layout: token-major per-token tensors, state tensors without the batch axis -----------
def to_wire(native: torch.Tensor, spec_shape: tuple[int, ...], per_token: bool) -> torch.Tensor:
    """Native ``[1, heads, T, *rest]`` -> contiguous ``[T, *spec_shape]``; states drop the batch."""
    if not per_token:
        return native[0].contiguous()
    x = native[0].movedim(1, 0)  # [T, heads, *rest]
    return x.reshape(x.shape[0], *spec_shape).contiguous()


def from_wire(wire: torch.Tensor, spec_shape: tuple[int, ...], per_token: bool) -> torch.Tensor:
    """Inverse of ``to_wire``: a view where the layout allows (no copy)."""
    if not per_token:
        return wire.unsqueeze(0)
    rows = wire.shape[0]
    heads_first = wire.reshape(rows, 1, *spec_shape) if len(spec_shape) == 1 else wire
    return heads_first.movedim(0, 1).unsqueeze(0)


def tensor_from_bytes(buf: memoryview, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor over ``buf`` without copying (``buf`` must be writable and stay alive)."""
    if buf.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if buf.readonly:  # torch tensors are writable: give them their own copy
        buf = memoryview(bytearray(buf))
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous tensor, shared (the view keeps the tensor alive)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    array: Any = flat.view(torch.uint8).numpy()
    return memoryview(array).cast("B")


def layer_spec_names(spec: LayerCache) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, per_token) of a layer's tensors in spec order."""
    if spec.kind is LayerKind.LINEAR:
        return [(t.name, t.shape, False) for t in spec.fixed]
    return [(t.name, t.shape, True) for t in spec.per_token]
