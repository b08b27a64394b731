"""A deployment file that is not UTF-8 text is one line naming the file and exit status 2 in
every command that reads one (all read it through ``config.load_yaml_mapping``), never a
traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from prfaas.cli import main

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def latin1(tmp_path: Path) -> Path:
    path = tmp_path / "d.yaml"
    path.write_bytes("model: qwen\nsites: []\n# caf\u00e9\n".encode("latin-1"))  # 0xe9 alone
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "{}"],
        ["serve", "--role", "gateway", "--config", "{}"],
        ["status", "{}"],
        ["drain", "{}", "d0"],
        ["tokenizer", "export", "-o", "out", "{}"],
        ["plan", "--deployment", "{}"],
        ["sim", "{}"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_file_that_is_not_utf8_is_one_line(
    argv: list[str], latin1: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([a.replace("{}", str(latin1)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{latin1}: not UTF-8 text" in err, err
