"""Named presets: the models of the paper's tables and common hardware.

Each entry names the public source of its numbers. ``paper-1t`` is the paper's internal model,
whose architecture was not published: its cache is *fitted* to the paper's Table 5 (see its comment)
and its timing comes from the shipped profile (``perf/profiles``), not the roofline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prfaas.spec.cache_spec import CacheSpec, LayerCache
from prfaas.spec.hardware import HardwareSpec
from prfaas.spec.model_spec import ModelSpec


def _repeat(block: Iterable[LayerCache], times: int) -> CacheSpec:
    return CacheSpec(tuple(block) * times)


def _paper_1t() -> ModelSpec:
    # Source: PAPER.md (arXiv 2604.15039, Table 5), "Kimi-Linear-like, KDA:MLA 3:1". The
    # architecture is not published; this cache is FITTED (an assumption) to Table 5's S_kv: 15 MLA
    # layers of a 512-dim latent + 64-dim RoPE key in bf16 (16.875 KiB/token, the table's slope is
    # 16.7) and 45 KDA layers whose fp32 state (59 heads x 128 x 128) plus bf16 short-conv state
    # (q, k, v; kernel 4) total 171.8 MiB (the table's intercept is about 172). Every S_kv point
    # is within 1.6%.
    # Parameters and attention shape: Kimi-K2-like 1T total / 32B active, 64 heads of 192 dims,
    # int4 weights (as Kimi K2 Thinking ships) so that an 8xH20 instance can hold them.
    kda = LayerCache.linear((59, 128, 128), conv_shape=(3 * 59 * 128, 3))
    mla = LayerCache.mla(kv_lora_rank=512, rope_dim=64)
    return ModelSpec(
        name="paper-1t",
        cache=_repeat((kda, kda, kda, mla), 15),
        params=1.04e12,
        active_params=32e9,
        hidden_size=7168,
        num_attention_heads=64,
        attention_head_dim=192,
        weight_bytes_per_param=0.5,
        max_context_tokens=131072,
        source="PAPER.md Table 5 (fitted cache, profiled timing); Kimi-K2-like sizes (assumed)",
    )


def _kimi_linear_48b() -> ModelSpec:
    # Source: moonshotai/Kimi-Linear-48B-A3B-Instruct config.json: 27 layers, MLA at layers
    # 4, 8, 12, 16, 20, 24, 27 (1-based), KDA elsewhere; 32 heads x 128 dims, short conv kernel 4;
    # MLA kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128; hidden 2304; 48B / 3B active.
    kda = LayerCache.linear((32, 128, 128), conv_shape=(3 * 32 * 128, 3))
    mla = LayerCache.mla(kv_lora_rank=512, rope_dim=64)
    mla_layers = {4, 8, 12, 16, 20, 24, 27}
    layers = tuple(mla if i in mla_layers else kda for i in range(1, 28))
    return ModelSpec(
        name="kimi-linear-48b",
        cache=CacheSpec(layers),
        params=48e9,
        active_params=3e9,
        hidden_size=2304,
        num_attention_heads=32,
        attention_head_dim=192,
        max_context_tokens=1048576,
        source="moonshotai/Kimi-Linear-48B-A3B-Instruct config.json",
    )


def _qwen3_next_80b() -> ModelSpec:
    # Source: Qwen/Qwen3-Next-80B-A3B-Instruct config.json: 48 layers, 12 x (3 Gated DeltaNet +
    # 1 gated attention); attention 16 Q heads, 2 KV heads, head_dim 256; DeltaNet 32 V heads and
    # 16 QK heads of 128 dims, conv kernel 4 over q, k, v (16*128*2 + 32*128 = 8192 channels);
    # hidden 2048; 80B / 3B active; 262,144 context.
    gdn = LayerCache.linear((32, 128, 128), conv_shape=(8192, 3))
    attn = LayerCache.gqa(num_kv_heads=2, head_dim=256)
    return ModelSpec(
        name="qwen3-next-80b-a3b",
        cache=_repeat((gdn, gdn, gdn, attn), 12),
        params=80e9,
        active_params=3e9,
        hidden_size=2048,
        num_attention_heads=16,
        attention_head_dim=256,
        max_context_tokens=262144,
        source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json",
    )


def _qwen35_397b() -> ModelSpec:
    # Source: Qwen/Qwen3.5-397B-A17B config.json: 60 layers, 15 x (3 Gated DeltaNet + 1 gated
    # attention); attention 32 Q heads, 2 KV heads, head_dim 256; DeltaNet 64 V heads, 16 QK heads
    # of 128 dims, conv kernel 4 (16*128*2 + 64*128 = 12288 channels); hidden 4096; 397B/17B active.
    gdn = LayerCache.linear((64, 128, 128), conv_shape=(12288, 3))
    attn = LayerCache.gqa(num_kv_heads=2, head_dim=256)
    return ModelSpec(
        name="qwen3.5-397b-a17b",
        cache=_repeat((gdn, gdn, gdn, attn), 15),
        params=397e9,
        active_params=17e9,
        hidden_size=4096,
        num_attention_heads=32,
        attention_head_dim=256,
        max_context_tokens=262144,
        source="Qwen/Qwen3.5-397B-A17B config.json",
    )


def _mimo_v2_flash() -> ModelSpec:
    # Source: XiaomiMiMo/MiMo-V2-Flash config.json and model card: 48 layers, 5 sliding-window
    # layers (window 128, 8 KV heads) per global GQA layer (4 KV heads); K head dim 192, V 128;
    # 64 Q heads; hidden 4096; 309B / 15B active; 262,144 context.
    swa = LayerCache.swa(num_kv_heads=8, head_dim=192, v_head_dim=128, window_tokens=128)
    full = LayerCache.gqa(num_kv_heads=4, head_dim=192, v_head_dim=128)
    return ModelSpec(
        name="mimo-v2-flash",
        cache=_repeat((swa, swa, swa, swa, swa, full), 8),
        params=309e9,
        active_params=15e9,
        hidden_size=4096,
        num_attention_heads=64,
        attention_head_dim=192,
        weight_bytes_per_param=1.0,  # ships fp8 weights
        max_context_tokens=262144,
        source="XiaomiMiMo/MiMo-V2-Flash config.json",
    )


def _dense_gqa(
    name: str,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    num_heads: int,
    hidden: int,
    params: float,
    active: float,
    context: int,
    source: str,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        cache=_repeat((LayerCache.gqa(num_kv_heads, head_dim),), num_layers),
        params=params,
        active_params=active,
        hidden_size=hidden,
        num_attention_heads=num_heads,
        attention_head_dim=head_dim,
        max_context_tokens=context,
        source=source,
    )


_MODELS: dict[str, Callable[[], ModelSpec]] = {
    "paper-1t": _paper_1t,
    "kimi-linear-48b": _kimi_linear_48b,
    "qwen3-next-80b-a3b": _qwen3_next_80b,
    "qwen3.5-397b-a17b": _qwen35_397b,
    "mimo-v2-flash": _mimo_v2_flash,
    # Source: MiniMaxAI/MiniMax-M2.5 config.json: 62 layers of full GQA attention, 48 Q heads,
    # 8 KV heads, head_dim 128, hidden 3072; 230B / 10B active; 196,608 context.
    "minimax-m2.5": lambda: _dense_gqa(
        "minimax-m2.5", 62, 8, 128, 48, 3072, 230e9, 10e9, 196608,
        "MiniMaxAI/MiniMax-M2.5 config.json",
    ),
    # Source: Qwen/Qwen3-235B-A22B config.json: 94 layers, 64 Q heads, 4 KV heads, head_dim 128,
    # hidden 4096; 235B / 22B active; 131,072 context with YaRN.
    "qwen3-235b-a22b": lambda: _dense_gqa(
        "qwen3-235b-a22b", 94, 4, 128, 64, 4096, 235e9, 22e9, 131072,
        "Qwen/Qwen3-235B-A22B config.json",
    ),
    # Source: meta-llama/Llama-3.1-70B config.json: 80 layers, 64 Q heads, 8 KV heads, head_dim
    # 128, hidden 8192; 70.6B dense; 131,072 context.
    "llama-3.1-70b": lambda: _dense_gqa(
        "llama-3.1-70b", 80, 8, 128, 64, 8192, 70.6e9, 70.6e9, 131072,
        "meta-llama/Llama-3.1-70B config.json",
    ),
}  # fmt: skip

# Aliases the paper's tables use.
_MODEL_ALIASES = {
    "kimi-linear": "kimi-linear-48b",
    "qwen3-next": "qwen3-next-80b-a3b",
    "qwen3.5-397b": "qwen3.5-397b-a17b",
    "qwen3-235b": "qwen3-235b-a22b",
    "minimax-m2.5-dense": "minimax-m2.5",
    "llama-70b": "llama-3.1-70b",
}

# Efficiency and prefill overhead are CALIBRATED once per hardware, never per model: h200 on the
# paper's measured Table 5 (paper-1t: T(1K) = 0.44 s, T(128K) = 7.40 s under this roofline's FLOP
# count gives 27% of peak plus 0.41 s fixed); h20 on the H20 curve inferred in PAPER.md (its linear
# term gives 42% of peak, its intercept 0.47 s). h100 and b200 have no public profile: they take
# h200's figures (same software stack; an ASSUMPTION). docs/cost-model.md sets the roofline beside
# the paper's Table 3 with the error of each cell.
_HARDWARE: dict[str, HardwareSpec] = {
    # Source: NVIDIA H200 SXM datasheet: 989 TFLOP/s dense bf16, 4.8 TB/s HBM3e, 141 GB.
    "h200": HardwareSpec(
        "h200", 989e12, 4.8e12, 141e9, efficiency=0.27, prefill_overhead_s=0.41,
        source="NVIDIA H200 SXM datasheet",
    ),
    # Source: NVIDIA H20 product brief: 148 TFLOP/s dense bf16, 4.0 TB/s HBM3, 96 GB.
    "h20": HardwareSpec(
        "h20", 148e12, 4.0e12, 96e9, efficiency=0.42, prefill_overhead_s=0.47,
        source="NVIDIA H20 product brief",
    ),
    # Source: NVIDIA H100 SXM datasheet: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 80 GB.
    "h100": HardwareSpec(
        "h100", 989e12, 3.35e12, 80e9, efficiency=0.27, prefill_overhead_s=0.41,
        source="NVIDIA H100 SXM datasheet",
    ),
    # Source: NVIDIA HGX B200 datasheet: 2.25 PFLOP/s dense bf16 per GPU, 8 TB/s, 180 GB.
    "b200": HardwareSpec(
        "b200", 2.25e15, 8.0e12, 180e9, efficiency=0.27, prefill_overhead_s=0.41,
        source="NVIDIA HGX B200 datasheet",
    ),
}  # fmt: skip


def model_names() -> tuple[str, ...]:
    return tuple(_MODELS)


def hardware_names() -> tuple[str, ...]:
    return tuple(_HARDWARE)


def get_model(name: str) -> ModelSpec:
    key = _MODEL_ALIASES.get(name.lower(), name.lower())
    factory = _MODELS.get(key)
    if factory is None:
        raise KeyError(f"unknown model {name!r} (known: {', '.join(_MODELS)})")
    return factory()


def get_hardware(name: str) -> HardwareSpec:
    spec = _HARDWARE.get(name.lower())
    if spec is None:
        raise KeyError(f"unknown hardware {name!r} (known: {', '.join(_HARDWARE)})")
    return spec
