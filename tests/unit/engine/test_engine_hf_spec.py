"""CacheSpec from Hugging Face configs (pure): published configs give the presets' caches."""

from __future__ import annotations

import pytest

from prfaas.engine import (
    ModelFolderError,
    UnknownArchitecture,
    cache_map_from_config,
    check_architecture,
)
from prfaas.spec import DType, LayerKind, get_model

QWEN3_NEXT_80B = {  # Qwen/Qwen3-Next-80B-A3B-Instruct config.json (cache-relevant fields)
    "model_type": "qwen3_next",
    "num_hidden_layers": 48,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "hidden_size": 2048,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}
KIMI_LINEAR_48B = {  # moonshotai/Kimi-Linear-48B-A3B-Instruct config.json (no layer_types)
    "model_type": "kimi_linear",
    "num_hidden_layers": 27,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "kda_layers": [i for i in range(1, 28) if i not in {4, 8, 12, 16, 20, 24, 27}],
        "num_heads": 32,
        "head_dim": 128,
        "short_conv_kernel_size": 4,
    },
    "max_position_embeddings": 1048576,
    "torch_dtype": "bfloat16",
}


def test_qwen3_next_80b_matches_the_preset_up_to_the_conv_width() -> None:
    cmap = cache_map_from_config(QWEN3_NEXT_80B)
    preset = get_model("qwen3-next-80b-a3b").cache
    assert [la.kind for la in cmap.spec.layers] == [la.kind for la in preset.layers]
    assert cmap.spec.full_attention_bytes_per_token == preset.full_attention_bytes_per_token
    lin = cmap.spec.layers[0]
    assert lin.fixed[0].shape == (32, 128, 128) and lin.fixed[0].dtype is DType.FP32
    # transformers keeps all 4 conv columns; the preset counts the 3 a kernel of 4 needs.
    assert lin.fixed[1].shape == (8192, 4) and lin.fixed[1].dtype is DType.BF16
    assert cmap.model_layers == tuple(range(48))


def test_kimi_linear_48b_from_a_raw_config() -> None:
    cmap = cache_map_from_config(KIMI_LINEAR_48B)
    preset = get_model("kimi-linear-48b").cache
    assert [la.kind for la in cmap.spec.layers] == [la.kind for la in preset.layers]
    mla = cmap.spec.layers[3]
    assert mla.kind is LayerKind.MLA and mla.bytes_per_token == preset.layers[3].bytes_per_token
    assert cmap.spec.layers[0].fixed[0].shape == (32, 128, 128)


def test_other_architectures_and_dtype_override() -> None:
    nemo = cache_map_from_config(
        {
            "model_type": "nemotron_h",
            "hybrid_override_pattern": "M-M*",
            "num_hidden_layers": 4,
            "mamba_num_heads": 4,
            "mamba_head_dim": 32,
            "ssm_state_size": 16,
            "n_groups": 1,
            "conv_kernel": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 2048,
        },
        DType.BF16,
    )
    assert nemo.model_layers == (0, 2, 3)  # the MLP layer keeps no cache
    assert nemo.spec.layers[0].fixed[1].shape == (4 * 32 + 2 * 16, 4)
    swa = cache_map_from_config(
        {
            "model_type": "mistral",
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_size": 64,
            "sliding_window": 96,
            "max_position_embeddings": 1024,
        }
    )
    assert swa.spec.layers[0].window_tokens == 95 and swa.dtype is DType.FP32
    assert swa.spec.layers[0].per_token[0].shape == (2, 16)


def test_bad_configs_name_the_problem() -> None:
    with pytest.raises(UnknownArchitecture, match="'gpt2'"):
        cache_map_from_config({"model_type": "gpt2"})
    with pytest.raises(UnknownArchitecture, match="None"):
        check_architecture(None)
    broken = {k: v for k, v in QWEN3_NEXT_80B.items() if k != "linear_key_head_dim"}
    with pytest.raises(ModelFolderError, match="linear_key_head_dim"):
        cache_map_from_config(broken)
