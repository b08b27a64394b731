"""``--model PATH``: a ``ModelSpec`` from a Hugging Face config counts the parameters the real
model has (checked against the loaded weights) and carries the cache spec ``engine.torch`` uses;
``prfaas kv`` / ``plan`` take it, bad paths exit 2 naming them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from prfaas.cli import main
from prfaas.engine.hf_spec import cache_map_from_config
from prfaas.engine.torch import LoadedModel
from prfaas.engine.torch.loader import read_config
from prfaas.engine.torch.model_spec import model_spec_from_hf


@pytest.mark.parametrize("arch", ["qwen3_next", "llama", "nemotron_h"])
def test_counts_the_real_parameters(
    arch: str, model_dirs: dict[str, Path], loaded: Callable[[str, str], LoadedModel]
) -> None:
    spec = model_spec_from_hf(model_dirs[arch])
    real = sum(p.numel() for p in loaded(arch, "float32").model.parameters())
    assert spec.params == real
    assert spec.cache == cache_map_from_config(read_config(model_dirs[arch])).spec
    assert spec.weight_bytes_per_param == 4.0  # the tiny models are fp32
    if arch == "qwen3_next":  # 4 experts, 2 per token: half the routed weights are active
        assert spec.active_params < spec.params
    else:
        assert spec.active_params == spec.params


def test_config_json_path_and_cli(
    model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = model_dirs["llama"] / "config.json"
    assert model_spec_from_hf(config).params == model_spec_from_hf(model_dirs["llama"]).params
    assert main(["kv", "--model", str(config), "--lengths", "512", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["s_kv_bytes"] == model_spec_from_hf(config).cache.bytes_for(512)
    assert row["source"].startswith("roofline:")
    bad = tmp_path / "nothing.json"
    assert main(["kv", "--model", str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err
    args = ["plan", "--model", str(model_dirs["llama"]), "--max-tokens", "2000", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)
