"""`prfaas model`: user mistakes exit 2 with one line, before anything heavy is imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from prfaas.cli import main


def test_unknown_architecture_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "make-tiny", "--arch", "gpt2", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "unknown architecture 'gpt2'" in err and "qwen3_next" in err
    assert not (tmp_path / "m").exists()


def test_bad_vocab_and_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["model", "make-tiny", "--arch", "llama", "--out", str(tmp_path), "--vocab-size", "10"]
    assert main(args) == 2
    assert "--vocab-size" in capsys.readouterr().err
    assert main(["model", "info", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_for_vllm_refuses_what_vllm_cannot_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    assert (
        main(["model", "make-tiny", "--arch", "kimi_linear", "--for-vllm", "--out", str(out)]) == 2
    )
    assert "vLLM cannot load kimi_linear" in capsys.readouterr().err
    args = ["model", "make-tiny", "--arch", "qwen3_next", "--for-vllm", "--dtype", "float32"]
    assert main([*args, "--out", str(out)]) == 2
    assert "bfloat16 only" in capsys.readouterr().err
    assert not out.exists()


def test_vllm_variants_have_head_dims_vllm_cpu_accepts() -> None:
    from prfaas.engine.torch.tiny import _COMMON, TINY_CONFIGS, VLLM_TINY

    accepted = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}
    for arch, (overrides, _) in VLLM_TINY.items():
        config = {**_COMMON, **TINY_CONFIGS[arch], **overrides}
        assert config["head_dim"] in accepted, arch
        for key in ("linear_key_head_dim", "linear_value_head_dim"):
            if key in config:
                assert config[key] in (64, 128), (arch, key)
