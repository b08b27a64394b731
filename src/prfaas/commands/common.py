"""Helpers shared by CLI subcommands: preset lookup and trace lengths, as ``UsageError``s."""

from __future__ import annotations

import json
from pathlib import Path

from prfaas.errors import UsageError
from prfaas.perf.cost_model import CostModel, cost_model_for
from prfaas.spec import ModelSpec


def model_arg(value: str | None, flag: str = "--model") -> ModelSpec | str | None:
    """``--model``: a preset name as it is, or, for a folder or a ``.json`` file, the
    ``ModelSpec`` derived from that Hugging Face config (torch and transformers load then)."""
    if value is None or not (Path(value).is_dir() or value.endswith(".json")):
        return value
    from prfaas.engine.errors import EngineError

    try:
        from prfaas.engine.torch.model_spec import model_spec_from_hf
    except ImportError as exc:  # the engine extra is not installed
        raise UsageError(f"{flag} {value}: reading a model config needs torch ({exc})") from None
    try:
        return model_spec_from_hf(value)
    except EngineError as exc:
        raise UsageError(f"{flag} {value}: {exc}") from None


def cost_model_or_usage_error(model: ModelSpec | str, hardware: str) -> CostModel:
    try:
        return cost_model_for(model, hardware)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None


def profile_cost_model(path: Path, model: ModelSpec | str | None) -> CostModel:
    """The cost model of a profile file, its errors as ``UsageError`` (one line, exit 2)."""
    from prfaas.perf.profile_costs import cost_model_from_profile_file
    from prfaas.perf.profile_file import ProfileFileError

    try:
        return cost_model_from_profile_file(path, model)
    except ProfileFileError as exc:
        raise UsageError(str(exc)) from None


def positive(name: str, value: float) -> None:
    if not value > 0:
        raise UsageError(f"{name} must be > 0, got {value:g}")


def read_trace_lengths(path: Path) -> list[int]:
    """Prompt lengths (``input_length``) of a Mooncake-style JSONL trace; errors name the line."""
    if not path.is_file():
        raise UsageError(f"trace file {path} does not exist")
    lengths: list[int] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                length = record["input_length"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                kind = (
                    "missing input_length" if isinstance(exc, KeyError | TypeError) else "bad JSON"
                )
                raise UsageError(f"{path}:{number}: {kind}: {line.strip()[:80]!r}") from None
            if not isinstance(length, int) or length <= 0:
                raise UsageError(
                    f"{path}:{number}: input_length must be a positive integer, got {length!r}"
                )
            lengths.append(length)
    if not lengths:
        raise UsageError(f"trace file {path} holds no requests")
    return lengths


def check_api_key_env() -> None:
    """``$PRFAAS_API_KEY``, when set, must be a usable key: checked before any process starts (the
    gateway would otherwise fail in its child process with a traceback)."""
    import os

    from prfaas.serve.api.api_keys import API_KEY_ENV
    from prfaas.serve.api.config import MIN_API_KEY_CHARS, valid_api_key

    key = os.environ.get(API_KEY_ENV, "")
    if key and not valid_api_key(key):
        raise UsageError(
            f"${API_KEY_ENV} must be at least {MIN_API_KEY_CHARS} printable ASCII characters "
            "without spaces"
        )
