"""The benchmark clients' flags as `prfaas tokenizer export --help` and docs/api.md give them:
guidellm 0.8 takes ``--tokenizer kind=huggingface_auto,model=DIR`` (its ``--processor`` is
gone); vLLM's client runs as ``.venv-vllm/bin/vllm`` (the command ``make vllm-venv`` writes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prfaas.cli import main

pytestmark = pytest.mark.timeout(30)
API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_tokenizer_export_help_gives_guidellm_its_tokenizer_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["tokenizer", "export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "guidellm 0.8 --tokenizer kind=huggingface_auto,model=DIR" in text
    assert "--processor" not in text


def test_the_api_doc_gives_the_same_flags() -> None:
    text = API_DOC.read_text(encoding="utf-8")
    assert "--tokenizer kind=huggingface_auto,model=" in text and "--processor" not in text
    assert ".venv-vllm/bin/vllm bench serve" in text
