"""``prfaas bench`` against the test gateway: a small synthetic run and a trace slice produce the
JSON summary; bad flags and an unreachable URL exit 2 with one line on stderr."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from serve_api_fakes import MODEL, Server

from prfaas.cli import main

pytestmark = pytest.mark.timeout(60)

DIST_KEYS = {"count", "mean", "p50", "p90", "p99", "max"}


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    status = main(["bench", "--json", *argv])
    out = capsys.readouterr().out
    return status, json.loads(out)


def test_synthetic_run_reports_the_schema(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    status, summary = bench(
        capsys, "--url", server.url + "/v1", "--rate", "50", "--num-requests", "12",
        "--min-tokens", "8", "--max-tokens", "400", "--mu", "4", "--output-tokens", "6",
        "--concurrency", "4",
    )  # fmt: skip
    assert status == 0
    assert summary["model"] == MODEL  # discovered from /v1/models
    assert (summary["requests"], summary["completed"], summary["failed"]) == (12, 12, 0)
    assert summary["failures"] == {} and summary["rejected_429"] == 0
    assert summary["output_tokens"] == 12 * 6
    assert summary["throughput_rps"] > 0 and summary["duration_s"] > 0
    for key in ("ttft_s", "tpot_s", "itl_s", "latency_s"):
        assert set(summary[key]) == DIST_KEYS
    assert summary["ttft_s"]["count"] == 12
    assert summary["itl_s"]["count"] <= 12 * 5  # fewer when the gateway merged waiting tokens
    d = summary["ttft_s"]
    assert 0 < d["p50"] <= d["p90"] <= d["p99"] <= d["max"]
    assert summary["workload"]["num_clipped_to_context"] == 0


def test_trace_run_with_failures_counted(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 10, "input_length": 600, "output_length": 4, "hash_ids": [0, 2]},
        {"timestamp": 20, "input_length": 30, "output_length": 2000, "hash_ids": [3]},
        {"timestamp": 30, "input_length": 20, "output_length": 5, "hash_ids": [4]},
        {"timestamp": 99999, "input_length": 20, "output_length": 5, "hash_ids": [5]},
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    status, summary = bench(
        capsys, "--url", server.url, "--model", MODEL, "--trace", str(trace), "--rate-scale", "10",
        "--num-requests", "4",
    )  # fmt: skip
    assert status == 0
    assert summary["requests"] == 4 and summary["completed"] == 4
    # Prompts over the 512-token context (and the 2000-token answer) were clipped to fit.
    assert summary["workload"]["num_clipped_to_context"] == 3
    # 700 -> 509 + 3, 600 -> 508 + 4, 30 + (2000 -> 482), 20 + 5 (the fake answers max_tokens)
    assert summary["output_tokens"] == 3 + 4 + 482 + 5
    assert summary["prompt_tokens"] == 509 + 508 + 30 + 20


def test_failures_are_counted_by_reason(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    status, summary = bench(
        capsys, "--url", server.url, "--num-requests", "3", "--rate", "100", "--min-tokens", "8",
        "--max-tokens", "64", "--mu", "3", "--no-clip", "--output-tokens", "600",
    )  # fmt: skip
    assert status == 1  # nothing completed
    assert summary["failures"] == {"http_400": 3}
    assert "context" in summary["failure_examples"]["http_400"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--url", "http://127.0.0.1:{port}"], "cannot reach"),
        (["--url", "ftp://x"], "--url"),
        (["--rate", "0"], "--rate"),
        (["--num-requests", "0"], "--num-requests"),
        (["--concurrency", "0"], "--concurrency"),
        (["--min-tokens", "10", "--max-tokens", "5"], "--min-tokens"),
        (["--trace", "/nonexistent/trace.jsonl"], "does not exist"),
    ],
)
def test_bad_flags_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    status = main(["bench", *(a.format(port=port) for a in argv)])
    err = capsys.readouterr().err
    assert status == 2
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unknown_model_exits_2(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--url", server.url, "--model", "gpt-9"]) == 2
    assert "not served" in capsys.readouterr().err


def test_bad_trace_exits_2(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{oops\n')
    assert main(["bench", "--url", server.url, "--trace", str(trace)]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
