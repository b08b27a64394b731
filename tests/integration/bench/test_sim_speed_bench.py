"""bench/sim_speed.py --before: both versions measured in fresh processes, side by side. Run
on this checkout's own src as "before" (a short paper case, no trace, one round), so only the
harness is under test: the same requests and events on both sides. No speed is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# CPU-bound bench runs asserting nothing timed: make test runs them in the back stream.
pytestmark = pytest.mark.behind

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench" / "sim_speed.py"


@pytest.mark.timeout(120)
def test_side_by_side_runs_both_versions_on_the_same_requests(tmp_path: Path) -> None:
    absent = str(tmp_path / "absent.jsonl")
    cmd = [sys.executable, str(BENCH), "--runs", "1", "--duration", "100", "--trace", absent,
           "--before", str(ROOT / "src"), "--json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=110, check=True)
    result = json.loads(out.stdout)
    assert result["rounds"] == 1 and "mooncake_trace" not in result
    case = result["paper_saturation"]
    before, after = case["before"], case["after"]
    assert before["runs"] == after["runs"] == 1
    assert before["requests"] == after["requests"] > 0
    assert before["events"] == after["events"] > before["requests"]
    assert case["cpu_change"] == pytest.approx(after["cpu_s"] / before["cpu_s"] - 1, abs=1e-3)


@pytest.mark.timeout(60)
def test_a_before_tree_without_prfaas_is_named_not_measured(tmp_path: Path) -> None:
    """An empty folder: the installed prfaas (this checkout) would answer the import."""
    cmd = [sys.executable, str(BENCH), "--runs", "1", "--duration", "10",
           "--trace", str(tmp_path / "absent.jsonl"), "--before", str(tmp_path)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=50)
    assert out.returncode != 0
    assert f"importing prfaas from {tmp_path.resolve()} failed" in out.stderr
