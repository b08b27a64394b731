"""``Manifest``: what one session carries, layer by layer, derived from ``CacheSpec.layout``.

The receiver allocates from it before any payload moves and bounds every chunk by it: a chunk may
only write inside the byte range of the layer it names. Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prfaas.spec import CacheLayout, DType, LayerKind, LayerSegment

# Codec limits (docs/wire-format.md). They bound what a manifest can make a receiver allocate
# before its own per-session budget is even consulted.
MAX_REQUEST_ID_BYTES = 128
MAX_LAYERS = 4096
MAX_TENSORS_PER_LAYER = 8
MAX_TENSOR_NAME_BYTES = 64
MAX_TENSOR_DIMS = 8
MAX_DIM = 2**32 - 1
MAX_SESSION_BYTES = 2**48
MAX_FINGERPRINT_FIELDS = 16
MAX_FINGERPRINT_NAME_BYTES = 32
MAX_FINGERPRINT_VALUE_BYTES = 128


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor of one layer as it crosses; ``shape`` includes the token axis if it has one."""

    name: str
    dtype: DType
    shape: tuple[int, ...]

    @property
    def num_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.num_bytes


@dataclass(frozen=True, slots=True)
class LayerEntry:
    """One layer's share of a session: its tensors back to back, ``num_bytes`` in all."""

    layer_index: int
    kind: LayerKind
    first_token: int
    num_token_rows: int
    tensors: tuple[TensorEntry, ...]

    @property
    def num_bytes(self) -> int:
        return sum(t.num_bytes for t in self.tensors)


@dataclass(frozen=True, slots=True)
class Manifest:
    """The cache a session carries. Layers are in the order ``layout`` gave them; ``layers[i]`` is
    addressed on the wire by its position ``i`` (not by ``layer_index``)."""

    request_id: str
    num_tokens: int
    num_cached_tokens: int
    layers: tuple[LayerEntry, ...]
    fingerprint: tuple[tuple[str, str], ...] = ()
    """The sender's model fingerprint (``core.fingerprint``: field, value), which the receiver
    compares with its own before allocating; empty: not stated (a vLLM connector's sender)."""

    def __post_init__(self) -> None:
        rid = self.request_id.encode()
        if not 0 < len(rid) <= MAX_REQUEST_ID_BYTES:
            raise ValueError(f"request_id must be 1..{MAX_REQUEST_ID_BYTES} bytes, got {rid!r}")
        if not 0 < len(self.layers) <= MAX_LAYERS:
            raise ValueError(f"a manifest needs 1..{MAX_LAYERS} layers, got {len(self.layers)}")
        if not 0 <= self.num_cached_tokens <= self.num_tokens:
            raise ValueError(
                f"num_cached_tokens {self.num_cached_tokens} not in [0, {self.num_tokens}]"
            )
        for layer in self.layers:
            if len(layer.tensors) > MAX_TENSORS_PER_LAYER:
                raise ValueError(f"layer {layer.layer_index}: more than {MAX_TENSORS_PER_LAYER}")
            for t in layer.tensors:
                if not 0 < len(t.name.encode()) <= MAX_TENSOR_NAME_BYTES:
                    raise ValueError(f"tensor name {t.name!r}: 1..{MAX_TENSOR_NAME_BYTES} bytes")
                if len(t.shape) > MAX_TENSOR_DIMS or any(not 0 <= d <= MAX_DIM for d in t.shape):
                    raise ValueError(f"tensor {t.name!r}: bad shape {t.shape}")
        if len(self.fingerprint) > MAX_FINGERPRINT_FIELDS:
            raise ValueError(f"a fingerprint has at most {MAX_FINGERPRINT_FIELDS} fields")
        for name, value in self.fingerprint:
            if not 0 < len(name.encode()) <= MAX_FINGERPRINT_NAME_BYTES:
                raise ValueError(f"fingerprint field {name!r}: 1..{MAX_FINGERPRINT_NAME_BYTES} B")
            if len(value.encode()) > MAX_FINGERPRINT_VALUE_BYTES:
                raise ValueError(f"fingerprint.{name}: over {MAX_FINGERPRINT_VALUE_BYTES} bytes")
        if self.num_bytes > MAX_SESSION_BYTES:
            raise ValueError(f"manifest of {self.num_bytes} bytes exceeds {MAX_SESSION_BYTES}")

    @classmethod
    def from_layout(
        cls,
        request_id: str,
        layout: CacheLayout,
        fingerprint: tuple[tuple[str, str], ...] = (),
    ) -> Manifest:
        return cls(
            request_id,
            layout.num_tokens,
            layout.num_cached_tokens,
            tuple(_entry(seg) for seg in layout.segments),
            fingerprint,
        )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_bytes(self) -> int:
        return sum(layer.num_bytes for layer in self.layers)

    def layer_bytes(self) -> tuple[int, ...]:
        return tuple(layer.num_bytes for layer in self.layers)


def _entry(seg: LayerSegment) -> LayerEntry:
    tensors = tuple(TensorEntry(t.name, t.dtype, t.shape) for t in seg.tensors)
    return LayerEntry(seg.layer_index, seg.kind, seg.first_token, seg.num_token_rows, tensors)
