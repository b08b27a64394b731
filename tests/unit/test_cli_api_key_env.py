"""A bad ``$PRFAAS_API_KEY`` is a usage error (exit 2, naming the variable) before any process
starts, for ``prfaas up`` and ``prfaas serve``; the key itself is never echoed."""

from __future__ import annotations

from pathlib import Path

import pytest

from prfaas.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "two-site.yaml"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "argv",
    [["up", str(EXAMPLE)], ["serve", "--role", "gateway", "--config", str(EXAMPLE)]],
)
def test_short_env_api_key_is_exit_2(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRFAAS_API_KEY", "shortk")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "$PRFAAS_API_KEY" in err and "shortk" not in err
