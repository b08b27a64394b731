"""``CacheSpec``: what one request's hybrid KV cache is made of, layer by layer.

Each layer keeps one of four kinds of cache:
- ``gqa``: full attention, K and V per token (2 x kv_heads x head_dim elements per token);
- ``mla``: multi-head latent attention, a compressed latent plus a RoPE key per token;
- ``swa``: sliding-window attention, like GQA but at most ``window_tokens`` tokens kept;
- ``linear``: linear attention / SSM, a fixed recurrent state plus a short conv state, whatever the
  length.
The same spec answers ``S_kv(l)`` (``bytes_for``) and the byte layout of what must cross to a decode
node that already holds a prefix (``layout``): only full-attention tokens past the cached prefix,
plus the SWA window and linear states as of the end of the prompt. The wire format uses ``layout``.
Pure: no I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

from prfaas.spec.dtype import DType


class LayerKind(enum.Enum):
    GQA = "gqa"
    MLA = "mla"
    SWA = "swa"
    LINEAR = "linear"

    @property
    def grows_with_length(self) -> bool:
        """Full-attention caches grow with every token; SWA and linear ones are bounded."""
        return self in (LayerKind.GQA, LayerKind.MLA)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One cached tensor of a layer. For per-token tensors ``shape`` excludes the token axis."""

    name: str
    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        if any(d <= 0 for d in self.shape):
            raise ValueError(f"tensor {self.name}: every dimension must be > 0, got {self.shape}")

    @property
    def num_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.num_bytes


@dataclass(frozen=True, slots=True)
class LayerCache:
    """The cache one layer keeps for one request."""

    kind: LayerKind
    per_token: tuple[TensorSpec, ...] = ()
    """Tensors with one row per kept token (full attention and SWA)."""
    fixed: tuple[TensorSpec, ...] = ()
    """Tensors whose size does not depend on the length (linear/SSM states)."""
    window_tokens: int | None = None
    """SWA only: at most this many tokens are kept."""

    def __post_init__(self) -> None:
        if self.kind is LayerKind.SWA and (self.window_tokens is None or self.window_tokens <= 0):
            raise ValueError(f"an swa layer needs window_tokens > 0, got {self.window_tokens}")
        if self.kind is not LayerKind.SWA and self.window_tokens is not None:
            raise ValueError(f"only swa layers have a window, not {self.kind.value}")
        if self.kind is LayerKind.LINEAR and (self.per_token or not self.fixed):
            raise ValueError("a linear layer keeps fixed state tensors only")
        if self.kind is not LayerKind.LINEAR and (self.fixed or not self.per_token):
            raise ValueError(f"a {self.kind.value} layer keeps per-token tensors only")

    # -- constructors for the four kinds --------------------------------------------------------
    @classmethod
    def gqa(
        cls,
        num_kv_heads: int,
        head_dim: int,
        dtype: DType = DType.BF16,
        v_head_dim: int | None = None,
    ) -> LayerCache:
        return cls(LayerKind.GQA, _kv_tensors(num_kv_heads, head_dim, v_head_dim, dtype))

    @classmethod
    def mla(cls, kv_lora_rank: int, rope_dim: int, dtype: DType = DType.BF16) -> LayerCache:
        return cls(
            LayerKind.MLA,
            (
                TensorSpec("kv_latent", (kv_lora_rank,), dtype),
                TensorSpec("k_rope", (rope_dim,), dtype),
            ),
        )

    @classmethod
    def swa(
        cls,
        num_kv_heads: int,
        head_dim: int,
        window_tokens: int,
        dtype: DType = DType.BF16,
        v_head_dim: int | None = None,
    ) -> LayerCache:
        tensors = _kv_tensors(num_kv_heads, head_dim, v_head_dim, dtype)
        return cls(LayerKind.SWA, tensors, window_tokens=window_tokens)

    @classmethod
    def linear(
        cls,
        state_shape: tuple[int, ...],
        conv_shape: tuple[int, ...] | None = None,
        state_dtype: DType = DType.FP32,
        conv_dtype: DType = DType.BF16,
    ) -> LayerCache:
        tensors = [TensorSpec("recurrent_state", state_shape, state_dtype)]
        if conv_shape is not None:
            tensors.append(TensorSpec("conv_state", conv_shape, conv_dtype))
        return cls(LayerKind.LINEAR, fixed=tuple(tensors))

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        return sum(t.num_bytes for t in self.per_token)

    @property
    def fixed_bytes(self) -> int:
        return sum(t.num_bytes for t in self.fixed)

    def kept_tokens(self, num_tokens: int) -> int:
        if self.kind is LayerKind.LINEAR:
            return 0
        if self.window_tokens is not None:
            return min(num_tokens, self.window_tokens)
        return num_tokens

    def bytes_for(self, num_tokens: int) -> int:
        return self.fixed_bytes + self.kept_tokens(num_tokens) * self.bytes_per_token


def _kv_tensors(
    num_kv_heads: int, head_dim: int, v_head_dim: int | None, dtype: DType
) -> tuple[TensorSpec, TensorSpec]:
    v_dim = head_dim if v_head_dim is None else v_head_dim
    return (
        TensorSpec("k", (num_kv_heads, head_dim), dtype),
        TensorSpec("v", (num_kv_heads, v_dim), dtype),
    )


@dataclass(frozen=True, slots=True)
class TensorSlice:
    """One tensor of one layer as it crosses: ``shape`` includes the token axis when it has one."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    num_bytes: int


@dataclass(frozen=True, slots=True)
class LayerSegment:
    """What of one layer must be sent: tensors in order, laid out back to back."""

    layer_index: int
    kind: LayerKind
    first_token: int
    """Index of the first token row sent (0 for states; the cached prefix length for GQA/MLA)."""
    num_token_rows: int
    tensors: tuple[TensorSlice, ...]

    @property
    def num_bytes(self) -> int:
        return sum(t.num_bytes for t in self.tensors)


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """The per-layer byte layout of one transfer."""

    num_tokens: int
    num_cached_tokens: int
    segments: tuple[LayerSegment, ...]

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.segments)


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """A model's per-request cache, one ``LayerCache`` per decoder layer, in layer order."""

    layers: tuple[LayerCache, ...]

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("a cache spec needs at least one layer")

    @classmethod
    def from_pattern(cls, pattern: Iterable[LayerCache]) -> CacheSpec:
        return cls(tuple(pattern))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def fixed_bytes(self) -> int:
        """Bytes that do not depend on length (linear states); SWA windows not included."""
        return sum(layer.fixed_bytes for layer in self.layers)

    @property
    def full_attention_bytes_per_token(self) -> int:
        return sum(la.bytes_per_token for la in self.layers if la.kind.grows_with_length)

    def bytes_for(self, num_tokens: int) -> int:
        """``S_kv(l)``: bytes of the whole cache of a request of ``num_tokens`` tokens."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return sum(layer.bytes_for(num_tokens) for layer in self.layers)

    def transfer_bytes(self, num_tokens: int, num_cached_tokens: int = 0) -> int:
        """Bytes that must cross when the receiver already holds ``num_cached_tokens``."""
        return self.layout(num_tokens, num_cached_tokens).num_bytes

    def layout(self, num_tokens: int, num_cached_tokens: int = 0) -> CacheLayout:
        """Per layer, what crosses: the uncached suffix of full-attention KV, the whole SWA window
        as of ``num_tokens`` and the linear states as of ``num_tokens``."""
        if num_tokens <= 0:
            raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
        if not 0 <= num_cached_tokens <= num_tokens:
            raise ValueError(
                f"num_cached_tokens must be in [0, {num_tokens}], got {num_cached_tokens}"
            )
        segments = []
        for i, layer in enumerate(self.layers):
            if layer.kind is LayerKind.LINEAR:
                first, rows = 0, 0
                tensors = tuple(
                    TensorSlice(t.name, t.dtype, t.shape, t.num_bytes) for t in layer.fixed
                )
            else:
                if layer.kind is LayerKind.SWA:
                    rows = layer.kept_tokens(num_tokens)
                    first = num_tokens - rows
                else:
                    first, rows = num_cached_tokens, num_tokens - num_cached_tokens
                tensors = tuple(
                    TensorSlice(t.name, t.dtype, (rows, *t.shape), rows * t.num_bytes)
                    for t in layer.per_token
                )
            segments.append(LayerSegment(i, layer.kind, first, rows, tensors))
        return CacheLayout(num_tokens, num_cached_tokens, tuple(segments))
