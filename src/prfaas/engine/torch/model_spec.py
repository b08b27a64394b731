"""A ``ModelSpec`` (what prices a model in the planner, ``prfaas kv`` and the roofline) from a
Hugging Face ``config.json`` or model folder, for ``--model PATH``.

The cache spec is the one ``engine.torch`` derives (``engine.hf_spec``, as ``prfaas model info``
prints it). Parameters are counted exactly by building the model on PyTorch's ``meta`` device
(shapes only: no memory, no weights read, nothing downloaded), so every architecture transformers
knows is counted the way it is built; routed-expert weights count towards ``active_params`` in
the share a token uses (``num_experts_per_tok / num_experts``). Imports torch and transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from prfaas.engine.errors import ModelFolderError
from prfaas.engine.hf_spec import cache_map_from_config
from prfaas.engine.torch.loader import config_mapping
from prfaas.spec import ModelSpec

# Config keys that name the routed experts and how many a token takes, across architectures.
_NUM_EXPERTS_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")
_EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "num_experts_per_token")


def _config_path(path: Path) -> Path:
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise ModelFolderError(f"{path}: no config.json there")
    try:
        raw = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"cannot read {config_path}: {exc}") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ModelFolderError(f"{config_path} is not a Hugging Face config (no model_type)")
    return config_path


def _first(cfg: dict[str, Any], keys: tuple[str, ...]) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def count_params(config: Any) -> tuple[float, float]:
    """(total, active per token) parameters of the model ``config`` describes."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    total = 0
    routed = 0
    for name, param in model.named_parameters():
        total += param.numel()
        # Routed experts only: a shared expert runs for every token.
        if ".experts." in name and "shared_expert" not in name:
            routed += param.numel()
    cfg = config.to_dict()
    num_experts = _first(cfg, _NUM_EXPERTS_KEYS)
    per_token = _first(cfg, _EXPERTS_PER_TOKEN_KEYS)
    active = float(total)
    if routed and num_experts and per_token:
        active = total - routed * (1.0 - per_token / num_experts)
    return float(total), active


def model_spec_from_hf(value: str | Path) -> ModelSpec:
    """The ``ModelSpec`` of the model whose config is ``value`` (a folder or its config.json).
    Errors (missing file, unknown architecture) are ``ModelFolderError`` / ``UnknownArchitecture``
    with one line naming the path."""
    path = Path(value)
    config_path = _config_path(path)
    try:
        # from_pretrained, not for_model: it decodes what save_pretrained wrote (Infinity...).
        config = AutoConfig.from_pretrained(str(config_path))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ModelFolderError(f"{config_path}: transformers cannot read it: {exc}") from None
    cfg = config_mapping(config)
    cmap = cache_map_from_config(cfg)
    params, active = count_params(config)
    heads = int(cfg.get("num_attention_heads") or 0)
    if cfg.get("qk_nope_head_dim") is not None:  # MLA: the query-key dims are nope + rope
        head_dim = int(cfg["qk_nope_head_dim"]) + int(cfg.get("qk_rope_head_dim") or 0)
    else:
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // max(heads, 1))
    name = (path if path.is_dir() else path.parent).name or str(path)
    return ModelSpec(
        name=name,
        cache=cmap.spec,
        params=params,
        active_params=active,
        hidden_size=int(cfg["hidden_size"]),
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        weight_bytes_per_param=float(cmap.dtype.num_bytes),
        max_context_tokens=cmap.max_context_tokens,
        source=f"{config_path} (parameters counted on the meta device)",
    )
