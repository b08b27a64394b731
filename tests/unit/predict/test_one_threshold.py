"""One ``t``, one workload description (issue 20 item 3): the gateway's, the simulator's and the
planner's ``t`` come from one function over the FILE's roles and the file's lengths (the trace's
when one is given), and a model whose context is shorter than the workload is cut, with a
warning, the same way in ``plan`` and ``sim``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prfaas.analytic import EmpiricalLengths, Planner, Scenario, TruncatedLogNormal
from prfaas.analytic.lengths import cut_to_context
from prfaas.cli import main
from prfaas.config import load_deployment
from prfaas.scenarios import planned_threshold, planner_for, sim_scenario, workload_lengths

pytestmark = pytest.mark.timeout(120)

# A PD site of one prefill and two decode nodes: the planner's own best split of three H20
# instances is not 1/2, so a t planned for its split would differ from one for the file's roles.
FILE = """\
engine: {kind: timed, model: paper-1t}
policy: {router: threshold}
sites:
  - {name: pd, kind: pd, hardware: h20, prefill_nodes: 1, decode_nodes: 2}
  - {name: far, kind: prfaas, hardware: h200, prefill_nodes: 1}
links: [{src: far, dst: pd, gbps: 100, rtt_ms: 5}]
workload:
  output_tokens: 256
"""


def _file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "d.yaml"
    path.write_text(FILE + extra, encoding="utf-8")
    return path


def _trace(tmp_path: Path) -> Path:
    lines = [
        json.dumps({"timestamp": 100 * i, "input_length": n, "output_length": 8, "hash_ids": []})
        for i, n in enumerate([500, 900, 3_000, 8_000, 12_000, 30_000, 60_000, 90_000] * 4)
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_t_is_planned_for_the_files_roles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = load_deployment(_file(tmp_path))
    t = planned_threshold(d)
    free = planner_for(d).plan().prfaas
    assert (free.n_p, free.n_d) != (1, 2)  # the planner alone would pick another split
    assert t == planner_for(d).plan(n_p=1).prfaas.threshold_tokens != free.threshold_tokens
    assert sim_scenario(d).threshold_tokens == t
    assert main(["plan", "--deployment", str(_file(tmp_path)), "--json", "--no-capacity"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["prfaas"]["threshold_tokens"], out["prfaas"]["n_p"], out["prfaas"]["n_d"]) == (
        t, 1, 2,
    )  # fmt: skip
    # The baselines have the file's node count (4), not the paper's 12.
    assert out["homogeneous"]["n_p"] + out["homogeneous"]["n_d"] == 4


def test_a_trace_plans_t_from_its_own_lengths(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    with_trace = load_deployment(_file(tmp_path, f"  trace: {trace}\n"))
    wl = workload_lengths(with_trace)
    assert isinstance(wl.lengths, EmpiricalLengths) and wl.lengths.num_samples == 32
    plain = load_deployment(_file(tmp_path))
    t_trace = planned_threshold(with_trace)
    assert t_trace == planned_threshold(plain, wl.lengths) != planned_threshold(plain)
    # `sim --trace` on the plain file plans from the trace too, as the file naming it does.
    assert sim_scenario(plain, str(trace)).threshold_tokens == t_trace


def test_context_shorter_than_the_workload_is_cut_the_same_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dist, warning = cut_to_context(TruncatedLogNormal(9.9, 1.0, 128, 131072), 4096, "w")
    assert dist.max_tokens == 4096 and warning is not None and "cut to 4096" in warning
    assert cut_to_context(dist, 4096, "w") == (dist, None)
    long = "  lengths: {mu: 11.5, sigma: 1.0, min_tokens: 128, max_tokens: 400000}\n"
    path = _file(tmp_path, long)
    d = load_deployment(path)
    wl = workload_lengths(d)
    assert wl.lengths.max_tokens == 131072 == wl.max_prompt_tokens  # paper-1t's context
    assert wl.warning is not None and "cut to 131072" in wl.warning
    assert main(["plan", "--deployment", str(path), "--json", "--no-capacity"]) == 0
    out = capsys.readouterr()
    assert "cut to 131072" in out.err
    t = json.loads(out.out)["prfaas"]["threshold_tokens"]
    assert t == planned_threshold(d) == sim_scenario(d).threshold_tokens
    assert main(["sim", str(path), "--duration", "20", "--json"]) == 0
    out = capsys.readouterr()
    assert "cut to 131072" in out.err
    sim = json.loads(out.out)["scenario"]
    assert sim["threshold_tokens"] == t and sim["max_prompt_tokens"] == 131072


def test_trace_throughput_is_over_the_replayed_span(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path)  # 32 requests over 3.1 s
    rc = main(["sim", str(_file(tmp_path)), "--trace", str(trace), "--duration", "600", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"]["completed"] == 32
    span = out["throughput_span_s"]
    assert 3.1 <= span < 600
    assert out["throughput_rps"] == pytest.approx(32 / span, rel=1e-6)


def test_planner_split_can_be_fixed() -> None:
    planner = Planner(Scenario())
    fixed = planner.plan(n_p=2).prfaas
    assert (fixed.n_p, fixed.n_d) == (2, 6)
    with pytest.raises(ValueError, match="N_p 8"):
        planner.plan(n_p=8)
