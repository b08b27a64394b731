"""Loading a local Hugging Face model folder (config, safetensors, tokenizer); nothing downloaded.

Checks the folder before touching transformers so a mistake gets one clear line: a missing folder
or file, an unreadable config, an architecture the engine does not run.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from prfaas.engine.errors import ModelFolderError
from prfaas.engine.hf_spec import HFCacheMap, cache_map_from_config, check_architecture
from prfaas.engine.torch.hf_cache import (
    LayerTap,
    load_pretrained,
    make_routing_batch_invariant,
    torch_dtype,
)
from prfaas.spec import DType

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: PreTrainedModel
    cmap: HFCacheMap
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    batch_invariant: bool
    """Decode steps give a request the same tokens whatever its batch (see hf_cache)."""
    tap: LayerTap
    """The model's layer-wise hand-out hooks, installed once at load."""
    forward_lock: threading.Lock = field(default_factory=threading.Lock, compare=False)
    """Held around every forward pass: engines sharing this model (tests do) never run two
    passes on its modules at once, even from their own threads."""


def read_config(model_dir: Path) -> dict[str, Any]:
    if not model_dir.is_dir():
        raise ModelFolderError(f"model folder {model_dir} does not exist")
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelFolderError(f"model folder {model_dir} has no config.json")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"cannot read {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise ModelFolderError(f"{path} is not a JSON object")
    return cfg


def check_folder(model_dir: Path) -> dict[str, Any]:
    cfg = read_config(model_dir)
    if not any(model_dir.glob("*.safetensors")):
        raise ModelFolderError(f"model folder {model_dir} has no *.safetensors weights")
    missing = [f for f in TOKENIZER_FILES if not (model_dir / f).is_file()]
    if missing:
        raise ModelFolderError(
            f"model folder {model_dir} lacks tokenizer file(s): {', '.join(missing)}"
        )
    return cfg


def config_mapping(config: PretrainedConfig) -> dict[str, Any]:
    """``config.to_dict()`` plus what transformers computes or aliases (layer types, context)."""
    out = config.to_dict()
    for key in ("layer_types", "max_position_embeddings"):
        value = getattr(config, key, None)
        if value is not None:
            out[key] = value
    return out


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def load_model(
    model_dir: Path | str,
    dtype: DType | None = None,
    batch_invariant: bool | None = None,
    device: str = "cpu",
) -> LoadedModel:
    """Load the model of ``model_dir`` in ``dtype`` (default: the config's) for inference.

    ``batch_invariant`` (default: for bf16/fp16) makes a request's tokens independent of its
    batch-mates bit for bit, at some cost (MoE experts token by token, no one-row decode steps).
    fp32 GEMMs on CPU round differently for every batch size, so fp32 is left as it is.
    ``device``: where the model runs ("cpu"; "cuda" is supported by the code but untested here).
    """
    path = Path(model_dir)
    cfg = check_folder(path)
    check_architecture(cfg.get("model_type"))  # before loading anything
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"cannot read the config of {path}: {exc}") from None
    cmap = cache_map_from_config(config_mapping(config), dtype)
    invariant = cmap.dtype is not DType.FP32 if batch_invariant is None else batch_invariant
    try:
        model = load_pretrained(path, torch_dtype(cmap.dtype.value), invariant)
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"cannot load model from {path}: {exc}") from None
    model.eval()  # type: ignore[no-untyped-call]
    try:
        model.to(device)  # type: ignore[arg-type]
    except (RuntimeError, ValueError) as exc:
        raise ModelFolderError(f"cannot move the model to {device!r}: {exc}") from None
    if invariant:
        make_routing_batch_invariant(model)
    eos = _eos_ids(model.generation_config.eos_token_id) or _eos_ids(model.config.eos_token_id)
    return LoadedModel(model, cmap, eos, int(model.config.vocab_size), invariant, LayerTap(model))


__all__ = ["LoadedModel", "check_folder", "load_model", "read_config"]
