"""``prfaas bench --find-max-rate`` against the test gateway: steps of constant rate, each judged
by the live capacity rule, and ``--extra-body`` / ``--ignore-eos`` reaching the server."""

from __future__ import annotations

import json

import pytest
from serve_api_fakes import Server

from prfaas.cli import main

pytestmark = pytest.mark.timeout(60)


def test_find_max_rate_steps_and_extra_body(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = '{"temperature": 0}'
    argv = ["bench", "--json", "--url", server.url, "--find-max-rate", "--rate", "20",
            "--num-requests", "8", "--min-tokens", "8", "--max-tokens", "64", "--mu", "3",
            "--output-tokens", "4", "--ignore-eos", "--extra-body", extra]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "prfaas.bench.max_rate/1"
    assert out["extra_body"] == {"temperature": 0, "ignore_eos": True}
    steps = out["steps"]
    assert len(steps) >= 2 and steps[0]["rate_rps"] == 20
    assert all(s["num_requests"] == 8 for s in steps)
    passed = [s["rate_rps"] for s in steps if s["passed"]]
    assert out["capacity_rps"] == (max(passed) if passed else 0.0)
    assert server.backend.last_request is not None and server.backend.last_request.ignore_eos
