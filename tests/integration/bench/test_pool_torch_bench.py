"""bench/pool_torch.py --sim-only: the files it writes are the pool simulator's input, and its
figures come out side by side. A hand-written profile file stands for the measured one (nothing
is profiled or run live here: that is the bench's own job, under the heavy lock)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# CPU-bound bench runs asserting nothing timed: make test runs them in the back stream.
pytestmark = pytest.mark.behind

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench" / "pool_torch.py"
PROFILE = """
version: 2
model:
  name: tiny-pool
  params: 258984.0
  hidden_size: 64
  num_attention_heads: 4
  attention_head_dim: 16
  weight_bytes_per_param: 4.0
  max_context_tokens: 16384
  cache:
    layers:
    - kind: linear
      fixed:
      - {name: recurrent_state, shape: [4, 16, 16], dtype: fp32}
    - kind: gqa
      per_token:
      - {name: k, shape: [2, 16], dtype: fp32}
      - {name: v, shape: [2, 16], dtype: fp32}
hardware: {name: cpu-core1, memory_bytes_per_instance: 8000000000.0}
measured_with: {source: test}
prefill:
  curve: piecewise-linear
  points:
  - {new_tokens: 512, cached_tokens: 0, median_s: 0.03, spread_s: 0.0, repeats: 1}
  - {new_tokens: 4096, cached_tokens: 0, median_s: 0.3, spread_s: 0.0, repeats: 1}
decode:
  model: linear
  points:
  - {batch: 1, context_tokens: 512, median_s: 0.006, spread_s: 0.0, repeats: 1}
  - {batch: 2, context_tokens: 512, median_s: 0.007, spread_s: 0.0, repeats: 1}
  - {batch: 1, context_tokens: 4096, median_s: 0.008, spread_s: 0.0, repeats: 1}
  - {batch: 2, context_tokens: 4096, median_s: 0.010, spread_s: 0.0, repeats: 1}
plumbing:
  prefill_per_request_s: 0.008
  decode_per_request_s: 0.004
  decode_per_kv_byte_s: 4.0e-09
  decode_per_output_token_s: 0.0005
  gateway_per_request_s: 0.007
  gateway_per_output_token_s: 0.0007
  decode_per_step_s: 0.0006
"""


@pytest.mark.timeout(60)
def test_sim_only_writes_the_files_and_prints_both_windows(tmp_path: Path) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    model = tmp_path / "tiny-pool"  # the folder's name is the profiled model's
    model.mkdir()
    out_json = tmp_path / "out.json"
    cmd = [sys.executable, str(BENCH), "--sim-only", "--quick", "--profile", str(profile),
           "--model-path", str(model), "--workdir", str(tmp_path / "wd"),
           "--json", str(out_json)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=50, check=True)
    assert "compute a/b (priced; promise 2)" in out.stdout
    charged = {line.split()[0]: "NOT charged" not in line for line in out.stdout.splitlines()
               if line.strip().split(" ")[0] in ("prefill_per_request_s", "decode_per_step_s",
                                                 "gateway_per_request_s")}  # fmt: skip
    assert charged == {"prefill_per_request_s": True, "decode_per_step_s": False,
                       "gateway_per_request_s": True}  # fmt: skip
    assert "the table may be stale" not in out.stdout
    pool = yaml.safe_load((tmp_path / "wd" / "pool.yaml").read_text())
    assert pool["groups"][0]["kind"] == "torch" and pool["groups"][0]["hardware"] == str(profile)
    assert [t["weight"] for t in pool["tenants"]] == [2, 1]
    tenants = [yaml.safe_load((tmp_path / "wd" / f"tenant-{t}.yaml").read_text()) for t in "ab"]
    assert tenants[0]["workload"]["lengths"] == tenants[1]["workload"]["lengths"]
    assert tenants[0]["pool"]["link"] == tenants[1]["pool"]["link"]
    assert tenants[0]["workload"]["duration_s"] < tenants[1]["workload"]["duration_s"]  # a stops
    result = json.loads(out_json.read_text())
    assert result["live"] is None
    both = result["sim"]["a"]["tenants"]
    ratio = (
        both["tenant-a"]["compute_share"]["g-torch"] / both["tenant-b"]["compute_share"]["g-torch"]
    )
    assert ratio == pytest.approx(2.0, rel=0.1)
    alone = result["sim"]["c"]["tenants"]
    assert alone["tenant-a"]["compute_share"]["g-torch"] == 0.0
    assert alone["tenant-b"]["compute_share"]["g-torch"] > 0.8


def test_sim_only_needs_a_profile(tmp_path: Path) -> None:
    cmd = [sys.executable, str(BENCH), "--sim-only", "--workdir", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "--sim-only needs --profile" in out.stderr
