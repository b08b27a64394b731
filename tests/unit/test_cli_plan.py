"""`prfaas plan` and `prfaas kv`: JSON schema, and bad input -> one line naming it, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prfaas.cli import main

PRFAAS_KEYS = {
    "threshold_tokens", "n_prfaas", "n_p", "n_d", "theta_prfaas", "theta_pdp", "theta_pdd",
    "lambda_max", "lambda_max_exact", "p_offload", "ttft_mean_s", "ttft_p90_s", "egress_gbps",
}  # fmt: skip
HOMOGENEOUS_KEYS = {"n_p", "n_d", "lambda_max", "lambda_max_exact", "ttft_mean_s", "ttft_p90_s"}
NAIVE_KEYS = {"n_prfaas", "n_d", "lambda_max", "lambda_max_exact", "ttft_mean_s", "ttft_p90_s"}


def test_plan_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert PRFAAS_KEYS <= set(out["prfaas"])
    assert HOMOGENEOUS_KEYS <= set(out["homogeneous"])
    assert NAIVE_KEYS <= set(out["naive"])
    assert {"prfaas_vs_homogeneous", "prfaas_vs_naive"} <= set(out["ratios"])
    assert out["prfaas"]["n_p"] == 3 and out["homogeneous"]["n_p"] == 9


def test_plan_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "fig5.png"
    assert main(["plan", "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "PrfaaS-PD" in text and "Homogeneous" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp.png"))


def test_plan_with_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    lines = [json.dumps({"timestamp": i, "input_length": 1000 + 97 * i}) for i in range(300)]
    trace.write_text("\n".join(lines) + "\n")
    assert main(["plan", "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 1000 <= out["prfaas"]["threshold_tokens"] <= 1000 + 97 * 299


def test_kv_json_reproduces_table5(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kv", "--model", "paper-1t", "--hardware", "h200", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["length"] for r in rows] == [1024, 8192, 32768, 131072]
    assert set(rows[0]) == {"length", "s_kv_bytes", "t_prefill_s", "phi_kv_gbps", "source"}
    expected = [3.61, 3.59, 3.19, 2.62]
    for row, phi in zip(rows, expected, strict=True):
        assert row["phi_kv_gbps"] == pytest.approx(phi, rel=0.02)


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "--n-prfaas", "0"], "--n-prfaas must be > 0, got 0"),
        (["plan", "--n-local", "-3"], "--n-local must be > 0, got -3"),
        (["plan", "--link-gbps", "0"], "--link-gbps must be > 0, got 0"),
        (["plan", "--threshold", "500000"], "threshold 500000 is outside the length range"),
        (["plan", "--model", "gpt-9"], "unknown model 'gpt-9'"),
        (["plan", "--local-hardware", "tpu"], "unknown hardware 'tpu'"),
        (["plan", "--trace", "/nonexistent.jsonl"], "does not exist"),
        (["kv", "--hardware", "a100"], "unknown hardware 'a100'"),
        (["kv", "--lengths", "0"], "length 0 is outside"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_trace_files_name_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = json.dumps({"input_length": 100})
    cases = {
        "empty.jsonl": ("", "holds no requests"),
        "badjson.jsonl": (f"{good}\n{{oops\n", ":2: bad JSON"),
        "nolength.jsonl": (f'{good}\n{good}\n{{"x": 1}}\n', ":3: missing input_length"),
        "negative.jsonl": ('{"input_length": -5}\n', ":1: input_length must be a positive"),
    }
    for name, (text, needle) in cases.items():
        assert main(["plan", "--trace", _write(tmp_path, name, text)]) == 2, name
        assert needle in capsys.readouterr().err, name


@pytest.mark.timeout(60)
def test_cli_process_exit_status_and_no_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "prfaas.cli", "plan", "--n-d", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unrecognized arguments: --n-d" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "prfaas.cli", "plan", "--link-gbps", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
