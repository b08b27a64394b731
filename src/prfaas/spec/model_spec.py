"""``ModelSpec``: the parts of a model that set its cost: parameters, attention shape, cache.

Enough to price prefill and decode with a roofline and to size the KV cache; not enough to run it
(``engine/`` reads real model folders). Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.spec.cache_spec import CacheSpec, LayerKind


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    cache: CacheSpec
    """One entry per decoder layer: its kind and what it caches."""
    params: float
    """Total parameters."""
    active_params: float
    """Parameters used per token (MoE: shared + routed experts taken)."""
    hidden_size: int
    num_attention_heads: int
    """Query heads of the full-attention / SWA layers (sets the attention FLOPs)."""
    attention_head_dim: int
    """Query-key head dim of the attention layers (MLA: nope + rope dims)."""
    weight_bytes_per_param: float = 2.0
    """Bytes per stored weight (bf16: 2, fp8: 1, int4: 0.5): sets decode's weight reads."""
    max_context_tokens: int = 131072
    source: str = ""
    """Where the numbers come from (a public config or paper)."""

    def __post_init__(self) -> None:
        if self.active_params <= 0 or self.params < self.active_params:
            raise ValueError(
                f"model {self.name}: need 0 < active_params <= params, "
                f"got {self.active_params} / {self.params}"
            )
        if self.weight_bytes_per_param <= 0:
            raise ValueError(f"model {self.name}: weight_bytes_per_param must be > 0")
        if self.max_context_tokens <= 0:
            raise ValueError(f"model {self.name}: max_context_tokens must be > 0")

    @property
    def weight_bytes(self) -> float:
        return self.params * self.weight_bytes_per_param

    @property
    def num_layers(self) -> int:
        return self.cache.num_layers

    @property
    def layer_pattern(self) -> str:
        """One letter per layer: G(QA), M(LA), S(WA), L(inear)."""
        letters = {
            LayerKind.GQA: "G",
            LayerKind.MLA: "M",
            LayerKind.SWA: "S",
            LayerKind.LINEAR: "L",
        }
        return "".join(letters[layer.kind] for layer in self.cache.layers)

    def count_layers(self, kind: LayerKind) -> int:
        return sum(1 for layer in self.cache.layers if layer.kind is kind)

    @property
    def is_hybrid(self) -> bool:
        return any(not layer.kind.grows_with_length for layer in self.cache.layers)
