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
