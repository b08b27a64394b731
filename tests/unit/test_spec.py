"""spec: per-kind cache sizes, incremental layouts, presets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prfaas.spec import (
    CacheSpec,
    DType,
    LayerCache,
    LayerKind,
    get_hardware,
    get_model,
    hardware_names,
    model_names,
)

MIB = 2**20
TABLE5_S_KV_MIB = {1024: 190.8, 8192: 308.9, 32768: 701.3, 131072: 2316.3}


def test_sizes_of_each_layer_kind() -> None:
    gqa = LayerCache.gqa(num_kv_heads=8, head_dim=128)
    assert gqa.bytes_for(10) == 10 * 2 * 8 * 128 * 2
    mla = LayerCache.mla(kv_lora_rank=512, rope_dim=64)
    assert mla.bytes_for(10) == 10 * 576 * 2
    swa = LayerCache.swa(num_kv_heads=8, head_dim=128, window_tokens=4)
    assert swa.bytes_for(3) == 3 * 4096 and swa.bytes_for(100) == 4 * 4096
    lin = LayerCache.linear((32, 128, 128), conv_shape=(8192, 3))
    assert lin.bytes_for(1) == lin.bytes_for(10**6) == 32 * 128 * 128 * 4 + 8192 * 3 * 2
    assert lin.fixed[0].dtype is DType.FP32  # recurrent states stay fp32 in bf16 models


def test_layer_cache_rejects_inconsistent_kinds() -> None:
    with pytest.raises(ValueError, match="window"):
        LayerCache(LayerKind.SWA, LayerCache.gqa(1, 1).per_token)
    with pytest.raises(ValueError, match="fixed state"):
        LayerCache(LayerKind.LINEAR, LayerCache.gqa(1, 1).per_token)


def test_layout_sends_only_the_uncached_suffix_plus_states() -> None:
    spec = CacheSpec(
        (
            LayerCache.linear((2, 4, 4)),
            LayerCache.gqa(2, 8),
            LayerCache.swa(2, 8, window_tokens=16),
        )
    )
    layout = spec.layout(num_tokens=100, num_cached_tokens=64)
    lin, gqa, swa = layout.segments
    assert lin.num_bytes == 2 * 4 * 4 * 4 and lin.num_token_rows == 0
    assert (gqa.first_token, gqa.num_token_rows) == (64, 36)
    assert gqa.tensors[0].shape == (36, 2, 8) and gqa.num_bytes == 36 * 2 * 2 * 8 * 2
    assert (swa.first_token, swa.num_token_rows) == (84, 16)
    assert layout.num_bytes == spec.transfer_bytes(100, 64)
    assert spec.layout(100).num_bytes == spec.bytes_for(100)
    with pytest.raises(ValueError, match="num_cached_tokens"):
        spec.layout(10, 11)


@given(
    st.integers(1, 4096),
    st.integers(0, 4096),
    st.lists(st.sampled_from(["gqa", "mla", "swa", "linear"]), min_size=1, max_size=6),
)
def test_layout_bytes_equal_full_minus_cached_full_attention(
    n: int, cached: int, kinds: list[str]
) -> None:
    make = {
        "gqa": lambda: LayerCache.gqa(2, 16),
        "mla": lambda: LayerCache.mla(32, 8),
        "swa": lambda: LayerCache.swa(2, 16, window_tokens=64),
        "linear": lambda: LayerCache.linear((2, 8, 8), conv_shape=(16, 3)),
    }
    spec = CacheSpec(tuple(make[k]() for k in kinds))
    cached = min(cached, n)
    expected = spec.bytes_for(n) - cached * spec.full_attention_bytes_per_token
    assert spec.transfer_bytes(n, cached) == expected


def test_paper_1t_cache_is_fitted_to_table5_within_2_percent() -> None:
    model = get_model("paper-1t")
    assert model.layer_pattern == "LLLM" * 15
    for length, mib in TABLE5_S_KV_MIB.items():
        assert model.cache.bytes_for(length) / MIB == pytest.approx(mib, rel=0.02)


def test_all_presets_load_and_hybrids_are_smaller_than_dense() -> None:
    for name in model_names():
        m = get_model(name)
        assert m.num_layers > 0 and m.source
    for name in hardware_names():
        assert get_hardware(name).source
    per_token = {n: get_model(n).cache.bytes_for(131072) / 131072 for n in model_names()}
    assert per_token["qwen3-next-80b-a3b"] < per_token["qwen3-235b-a22b"] / 5
    assert get_model("kimi-linear").name == "kimi-linear-48b"  # the paper's alias
    with pytest.raises(KeyError, match="unknown model 'gpt-9'"):
        get_model("gpt-9")
    with pytest.raises(KeyError, match="unknown hardware"):
        get_hardware("tpu")


def test_dtype_parse() -> None:
    assert DType.parse("bfloat16") is DType.BF16 and DType.FP32.num_bytes == 4
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        DType.parse("int3")
