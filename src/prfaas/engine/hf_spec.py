"""The ``CacheSpec`` of a Hugging Face model, derived from its ``config.json`` alone.

Per architecture, which decoder layers keep which cache (gqa / mla / swa / linear) and the exact
shape and dtype of every cached tensor as transformers 5.24 keeps it, minus the batch axis, so the
exported layout, the wire manifest and ``S_kv`` all agree. Recurrent states are fp32 whatever the
model dtype; conv states and KV use the model dtype. Layers without a cache (NemotronH MLP/MoE
layers) are left out of the spec; ``model_layers`` maps spec positions to model layer numbers.
Tensor shapes here are checked against real caches by the round-trip tests of ``engine.torch``.
Pure: reads a mapping, imports neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prfaas.engine.errors import ModelFolderError, UnknownArchitecture
from prfaas.spec import CacheSpec, DType, LayerCache, LayerKind, TensorSpec

SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "qwen3_next",
    "kimi_linear",
    "bamba",
    "nemotron_h",
    "mistral",
    "llama",
)


@dataclass(frozen=True, slots=True)
class HFCacheMap:
    """A model's cache spec plus, per spec position, the model's decoder layer number."""

    model_type: str
    spec: CacheSpec
    model_layers: tuple[int, ...]
    dtype: DType
    max_context_tokens: int


def _need(cfg: Mapping[str, Any], key: str) -> Any:
    if cfg.get(key) is None:
        raise ModelFolderError(f"config of a {cfg.get('model_type')} model lacks {key!r}")
    return cfg[key]


def _head_dim(cfg: Mapping[str, Any]) -> int:
    hd = cfg.get("head_dim")
    return (
        int(hd) if hd else int(_need(cfg, "hidden_size")) // int(_need(cfg, "num_attention_heads"))
    )


def _gqa(cfg: Mapping[str, Any], dtype: DType) -> LayerCache:
    kv_heads = int(cfg.get("num_key_value_heads") or _need(cfg, "num_attention_heads"))
    return LayerCache.gqa(kv_heads, _head_dim(cfg), dtype)


def _linear(conv_channels: int, kernel: int, state: tuple[int, ...], dtype: DType) -> LayerCache:
    return LayerCache(
        LayerKind.LINEAR,
        fixed=(
            TensorSpec("recurrent_state", state, DType.FP32),
            TensorSpec("conv_state", (conv_channels, kernel), dtype),
        ),
    )


def _layer_types(cfg: Mapping[str, Any]) -> list[str]:
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or _raw_layer_types(cfg)
    if not types:
        raise ModelFolderError(f"config of a {cfg.get('model_type')} model lacks layer_types")
    return [str(t) for t in types]


_PATTERN_LETTERS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


def _raw_layer_types(cfg: Mapping[str, Any]) -> list[str] | None:
    """Layer types as a raw config.json states them when it has no ``layer_types`` (transformers
    derives them the same way)."""
    n = int(cfg.get("num_hidden_layers") or 0)
    la = cfg.get("linear_attn_config")
    if isinstance(la, Mapping) and "full_attn_layers" in la:  # Kimi Linear: 1-based numbers
        full = {int(i) - 1 for i in la["full_attn_layers"]}
        return ["full_attention" if i in full else "linear_attention" for i in range(n)]
    if cfg.get("attn_layer_indices") is not None:  # Bamba
        full = {int(i) for i in cfg["attn_layer_indices"]}
        return ["full_attention" if i in full else "linear_attention" for i in range(n)]
    pattern = cfg.get("hybrid_override_pattern")  # NemotronH: one letter per layer
    if isinstance(pattern, str):
        return [_PATTERN_LETTERS.get(c, c) for c in pattern]
    return None


def _qwen3_next(cfg: Mapping[str, Any], dtype: DType) -> list[LayerCache | None]:
    nk, nv = int(_need(cfg, "linear_num_key_heads")), int(_need(cfg, "linear_num_value_heads"))
    dk, dv = int(_need(cfg, "linear_key_head_dim")), int(_need(cfg, "linear_value_head_dim"))
    lin = _linear(
        2 * nk * dk + nv * dv, int(_need(cfg, "linear_conv_kernel_dim")), (nv, dk, dv), dtype
    )
    full = _gqa(cfg, dtype)
    return [lin if t == "linear_attention" else full for t in _layer_types(cfg)]


def _kimi_linear(cfg: Mapping[str, Any], dtype: DType) -> list[LayerCache | None]:
    la = _need(cfg, "linear_attn_config")
    heads, hd = int(la["num_heads"]), int(la["head_dim"])
    lin = _linear(3 * heads * hd, int(la["short_conv_kernel_size"]), (heads, hd, hd), dtype)
    mla = LayerCache.mla(
        int(_need(cfg, "kv_lora_rank")), int(_need(cfg, "qk_rope_head_dim")), dtype
    )
    return [lin if t == "linear_attention" else mla for t in _layer_types(cfg)]


def _mamba2(
    cfg: Mapping[str, Any], dtype: DType, heads: str, head_dim: str, state: str, conv: str
) -> LayerCache:
    nh, hd, ds = int(_need(cfg, heads)), int(_need(cfg, head_dim)), int(_need(cfg, state))
    groups = int(cfg.get("mamba_n_groups") or cfg.get("n_groups") or 1)
    return _linear(nh * hd + 2 * groups * ds, int(_need(cfg, conv)), (nh, hd, ds), dtype)


def _bamba(cfg: Mapping[str, Any], dtype: DType) -> list[LayerCache | None]:
    lin = _mamba2(cfg, dtype, "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_d_conv")
    full = _gqa(cfg, dtype)
    return [lin if t == "linear_attention" else full for t in _layer_types(cfg)]


def _nemotron_h(cfg: Mapping[str, Any], dtype: DType) -> list[LayerCache | None]:
    lin = _mamba2(cfg, dtype, "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "conv_kernel")
    full = _gqa(cfg, dtype)
    kinds = {"linear_attention": lin, "mamba": lin, "full_attention": full, "attention": full}
    return [kinds.get(t) for t in _layer_types(cfg)]


def _mistral(cfg: Mapping[str, Any], dtype: DType) -> list[LayerCache | None]:
    n = int(_need(cfg, "num_hidden_layers"))
    window = cfg.get("sliding_window")
    if not window:
        return [_gqa(cfg, dtype)] * n
    kv_heads = int(cfg.get("num_key_value_heads") or _need(cfg, "num_attention_heads"))
    # transformers keeps window - 1 tokens: the next token's query sees them plus itself.
    swa = LayerCache.swa(kv_heads, _head_dim(cfg), int(window) - 1, dtype)
    return [swa] * n


def _llama(cfg: Mapping[str, Any], dtype: DType) -> list[LayerCache | None]:
    return [_gqa(cfg, dtype)] * int(_need(cfg, "num_hidden_layers"))


_DERIVERS: dict[str, Callable[[Mapping[str, Any], DType], list[LayerCache | None]]] = {
    "qwen3_next": _qwen3_next,
    "kimi_linear": _kimi_linear,
    "bamba": _bamba,
    "nemotron_h": _nemotron_h,
    "mistral": _mistral,
    "llama": _llama,
}


def config_dtype(cfg: Mapping[str, Any]) -> DType:
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return DType.parse(str(name).removeprefix("torch."))


def check_architecture(model_type: object) -> str:
    """``model_type`` if the engine runs it; else ``UnknownArchitecture`` naming it."""
    if model_type not in _DERIVERS:
        raise UnknownArchitecture(
            f"unknown architecture {model_type!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return str(model_type)


def cache_map_from_config(cfg: Mapping[str, Any], dtype: DType | None = None) -> HFCacheMap:
    """Derive the cache spec of the model ``cfg`` describes, computed in ``dtype`` (default: the
    config's). Raises ``UnknownArchitecture`` for a model type not in SUPPORTED_ARCHITECTURES."""
    model_type = check_architecture(cfg.get("model_type"))
    derive = _DERIVERS[model_type]
    dt = config_dtype(cfg) if dtype is None else dtype
    per_layer = derive(cfg, dt)
    kept = [(i, la) for i, la in enumerate(per_layer) if la is not None]
    max_ctx = int(cfg.get("max_position_embeddings") or 0)
    if max_ctx <= 0:
        raise ModelFolderError(f"config of a {model_type} model lacks max_position_embeddings")
    return HFCacheMap(
        model_type=model_type,
        spec=CacheSpec(tuple(la for _, la in kept)),
        model_layers=tuple(i for i, _ in kept),
        dtype=dt,
        max_context_tokens=max_ctx,
    )
