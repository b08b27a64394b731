"""bench/fidelity.py's pieces: the workload rescaling, the per-request comparison, and one tiny run
end to end (``--quick``: a model made, one core profiled with every plumbing term, a live torch
deployment launched once and driven by a burst and a load point, the same requests simulated from
the same file in every variant). No figure is asserted: only that both sides ran every request
and the report holds what it says it does."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench" / "fidelity.py"
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fidelity_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fid() -> ModuleType:
    return _bench()


@pytest.mark.timeout(30)
def test_at_rate_keeps_requests_and_sets_the_mean_rate(fid: ModuleType) -> None:
    from prfaas.workload.requests import SimRequestSpec

    specs = [SimRequestSpec(i, t, 100 + i, 4) for i, t in enumerate((0.0, 1.0, 1.5, 6.0))]
    fast = fid.at_rate(specs, 3.0)
    assert [sp.index for sp in fast] == [0, 1, 2, 3]
    assert [sp.num_prompt_tokens for sp in fast] == [100, 101, 102, 103]
    assert fast[-1].arrival_s == pytest.approx(3 / 3.0)  # 3 gaps at 3 requests/s
    assert fast[1].arrival_s == pytest.approx(1.0 / 6.0)  # shape kept: gaps scale together
    same_time = [SimRequestSpec(i, 5.0, 10, 1) for i in range(3)]
    assert [sp.arrival_s for sp in fid.at_rate(same_time, 2.0)] == [0.0, 0.5, 1.0]


@pytest.mark.timeout(30)
def test_summary_and_route_agreement_count_what_they_say(fid: ModuleType) -> None:
    def o(i: int, ok: bool, ttft: float, off: bool | None, site: str, cached: int) -> Any:
        return fid.Outcome(i, ok, 0.0, ttft, 2.0 * (i + 1), off, site, 1000, cached)

    live = [o(0, True, 0.1, True, "prfaas", 0), o(1, True, 0.3, False, "pd", 500),
            o(2, False, 0.0, None, "pd", 0), o(3, True, 0.2, False, "pd", 0)]  # fmt: skip
    sim = [o(0, True, 0.1, True, "prfaas", 0), o(1, True, 0.2, True, "prfaas", 0),
           o(2, True, 0.1, False, "pd", 0), o(3, True, 0.2, False, "pd", 0)]  # fmt: skip
    s = fid.summarize(live)
    assert (s["requests"], s["completed"], s["offloaded"]) == (4, 3, 1)
    assert s["throughput_rps"] == pytest.approx(3 / 8.0)  # 3 done by the last finish, 8 s
    assert s["ttft_p50_s"] == pytest.approx(0.2)
    assert s["prefix_hit_rate"] == {"pd": 0.25, "prfaas": 0.0}
    agreement = fid.route_agreement(live, sim)
    assert agreement["compared"] == 3  # the failed request has no live route
    assert (agreement["agree"], agreement["sim_only_offloaded"]) == (2, 1)


@pytest.mark.timeout(30)
def test_trace_slice_cuts_prompts_with_their_blocks(fid: ModuleType) -> None:
    if not TRACE.is_file():
        pytest.skip(f"no trace at {TRACE}")
    s = fid.Settings(workdir=Path("/nonexistent"), trace_requests=20, max_prompt_tokens=2000)
    specs = fid.trace_specs(s)
    assert len(specs) == 20 and specs[0].arrival_s == 0.0
    for sp in specs:
        assert sp.num_prompt_tokens <= 2000
        assert len(sp.block_hashes) == -(-sp.num_prompt_tokens // fid.BLOCK_TOKENS)
    # the slice keeps the trace's prefix reuse: some block is shared by several requests
    firsts = [sp.block_hashes[0] for sp in specs]
    assert len(set(firsts)) < len(firsts)


@pytest.mark.timeout(30)
def test_workload_shapes_are_new_per_seed_and_realistic(fid: ModuleType) -> None:
    for gen in (fid.session_specs, fid.lognormal_specs):
        a, b = gen(101, 40, 47), gen(202, 40, 47)
        assert len(a) == len(b) == 40
        assert [x.num_prompt_tokens for x in a] != [x.num_prompt_tokens for x in b]
        assert gen(101, 40, 47) == a  # a printed seed reproduces its run
        outputs = [x.num_output_tokens for x in a]
        assert min(outputs) >= 15 and max(outputs) <= 80  # tens of tokens
        assert [x.arrival_s for x in a] == sorted(x.arrival_s for x in a)
    sessions = fid.session_specs(7, 60, 47)
    assert all(50 <= x.num_prompt_tokens <= 3000 for x in sessions)
    firsts = [x.block_hashes[0] for x in sessions]
    assert len(set(firsts)) < len(firsts)  # turns of a session share their prefix


@pytest.mark.timeout(30)
def test_the_capacity_rule_looks_for_a_growing_queue(fid: ModuleType) -> None:
    def o(i: int, arrival: float, ttft: float, ok: bool = True) -> Any:
        return fid.Outcome(i, ok, arrival, ttft, arrival + ttft + 1.0, False, "pd", 100, 0)

    steady = [o(i, float(i), 0.3 + 0.1 * (i % 3)) for i in range(30)]
    assert fid.keeps_up(steady)
    behind = [o(i, i * 0.1, 0.3 + 0.05 * i) for i in range(30)]  # the queue grows
    assert fid.ttft_trend(behind)[1] > 1.0 and not fid.keeps_up(behind)
    assert not fid.keeps_up([*steady[:-1], o(29, 29.0, 0.3, ok=False)])
    assert fid.per_request_error(steady, steady) == 0.0


@pytest.mark.timeout(30)
def test_capacity_is_found_by_the_one_rule(fid: ModuleType) -> None:
    """``one_rule_capacity`` is ``prfaas bench --find-max-rate``'s search: on a FIFO server of
    0.2 s per request (capacity 5 req/s) it lands within the rule's tolerances of 5, and every
    step sent the same requests at a constant rate."""
    specs = fid.lognormal_specs(5, 60, 20)
    rates: list[float] = []

    def server(paced: list[Any]) -> list[Any]:
        rates.append((len(paced) - 1) / paced[-1].arrival_s)
        assert [sp.index for sp in paced] == [sp.index for sp in specs]
        free, out = 0.0, []
        for sp in paced:
            free = max(free, sp.arrival_s) + 0.2
            out.append(fid.Outcome(sp.index, True, sp.arrival_s, free - sp.arrival_s, free,
                                   False, "pd", sp.num_prompt_tokens, 0))  # fmt: skip
        return out

    capacity, steps = fid.one_rule_capacity(server, specs, 4.0, start_step=0.5)  # from 2
    assert 4.5 <= capacity <= 5.3, steps
    assert [st["rate_rps"] for st in steps] == pytest.approx(rates)
    assert steps[0]["rate_rps"] == pytest.approx(2.0) and steps[0]["passed"]
    assert any(not st["passed"] for st in steps)
    # --quick: the burst throughput stands for it, unsearched
    assert fid.one_rule_capacity(server, specs, 4.0, search=False) == (4.0, [])


@pytest.mark.timeout(30)
def test_live_capacity_is_the_median_of_independent_searches(fid: ModuleType) -> None:
    """Each search runs whole (its own steps, kept); the scored capacity is their median and the
    second over the first is the capacity's noise; one search has no noise to read."""
    found = {0: (10.0, [{"rate_rps": 8.0}]), 1: (12.0, [{"rate_rps": 9.0}]),
             2: (11.0, [{"rate_rps": 7.0}])}  # fmt: skip
    calls: list[int] = []

    def search(k: int) -> tuple[float, list[dict[str, float]]]:
        calls.append(k)
        return found[k]

    three = fid.repeated_capacity(search, 3)
    assert calls == [0, 1, 2]
    assert three["live_rps"] == 11.0 and three["live_repeats_rps"] == [10.0, 12.0, 11.0]
    assert three["noise"] == pytest.approx(1.2)
    assert three["live_steps"] == [{"rate_rps": 8.0}]
    assert three["live_repeat_steps"] == [[{"rate_rps": 9.0}], [{"rate_rps": 7.0}]]
    one = fid.repeated_capacity(search, 1)
    assert one["live_rps"] == 10.0 and one["noise"] is None and one["live_repeat_steps"] == []
    with pytest.raises(ValueError, match="got 0"):
        fid.repeated_capacity(search, 0)
    row = {"seed": 5, "capacity": three}
    assert fid._searches(row) == " (median of 10.00, 12.00, 11.00)"
    assert fid._searches({"seed": 5, "capacity": one}) == ""


@pytest.mark.behind  # ~50 s of torch CPU, no figure asserted: off make test's critical path
@pytest.mark.timeout(600)
def test_tiny_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "fidelity.json"
    cmd = [sys.executable, str(BENCH), "--quick", "--seed-list", "99",
           "--workdir", str(tmp_path / "work"), "--json", str(out)]  # fmt: skip
    # On SIGTERM the bench unwinds and its Launcher stops every process it started (they run in
    # sessions of their own, so a signal to the bench's group would not reach them).
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    try:
        stdout, _ = proc.communicate(timeout=360)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, stdout[-3000:]
    report = json.loads(out.read_text())
    assert report["seeds"] == [99]
    (row,) = report["rows"]
    assert (row["shape"], row["seed"]) == ("lognormal", 99)
    assert row["burst"]["live_rps"] > 0 and row["capacity"]["live_rps"] > 0
    assert set(row["burst"]["sim_rps"]) == set(row["capacity"]["sim_rps"])
    assert {"no terms", "all terms, step charged per token"} <= set(row["capacity"]["sim_rps"])
    assert row["capacity"]["live_rps"] == row["burst"]["live_rps"]  # --quick: no step search
    (point,) = row["loads"].values()
    n = report["requests"]
    assert point["live"]["completed"] == n
    assert point["variants"]["all terms"]["route_agreement"]["compared"] == n
    # each live repeat's CPU beside the simulated work of the same paced requests, for the
    # prefill-only processes (a decode node's work depends on its batches, not compared)
    assert len(point["live_cpu_s"]) == report["live_repeats"]
    assert set(point["sim_work_s"]) == {"pf0", "p0"} < set(point["live_cpu_s"][0])
    assert "live CPU / simulated work, each repeat: " in stdout
    # and split: each torch node's forward passes against the simulated passes alone
    assert len(point["live_forward_cpu_s"]) == report["live_repeats"]
    # (p0 prefills every short prompt on both sides; pf0 what offloads, here some of it too; the
    # passes alone can exceed all terms: a negative in-service excess refunds part of them)
    assert all(run["p0"] > 0 and run["pf0"] >= 0 for run in point["live_forward_cpu_s"]), (
        point["live_forward_cpu_s"], stdout[-3000:])  # fmt: skip
    assert set(point["sim_pass_work_s"]) == {"pf0", "p0"} and point["sim_pass_work_s"]["p0"] > 0
    assert "of which the passes (the nodes' forward_cpu_s / the curve x (1 + in-service " in stdout
    # the decode node's steps, live (each repeat, from its decode_steps) and simulated, and what
    # a step cost on each side: its batches and their price told apart
    assert all(steps["d0"] > 0 for steps in point["live_decode_steps"])
    assert point["sim_decode"]["d0"]["steps"] > 0 and point["sim_decode"]["d0"]["work_s"] > 0
    assert "  - decode d0: live " in stdout and " ms of work a step" in stdout
    deployment = Path(report["deployment"])
    from prfaas.config import load_deployment
    from prfaas.perf.profile_costs import cost_model_for_hardware
    from prfaas.perf.profile_file import ProfileFileError
    from prfaas.perf.profile_read import load_profile_file

    d = load_deployment(deployment)
    assert d.engine.kind == "torch" and d.policy.router == "prfaas"
    hardware = sorted(s.hardware for s in d.sites)
    assert hardware == sorted(str(Path(p).resolve()) for p in report["profiles"].values())
    # the served name takes the file's own model (the simulator's path); another name is refused
    assert cost_model_for_hardware(d.engine.model, hardware[0]).model.name == d.engine.model
    with pytest.raises(ProfileFileError, match="unknown model"):
        cost_model_for_hardware("not-the-profiled-model", hardware[0])
    # profiled as the engine prefills with checkpoints, and with every plumbing term measured
    # but the first token's two waits (said in the how, left missing: the measurement's gateway
    # shares its nodes' core, this deployment's does not)
    pf = load_profile_file(Path(hardware[0]))
    assert dict(pf.measured_with)["pass_tokens"] == str(d.engine.block_tokens)
    waits = {"first_token_wait_s", "first_token_wait_per_decoding_s"}
    # the prefill node's own passes in service (forward_cpu_s) against the curve: measured, said
    # per class; or, where
    # the --quick curve (two lengths, on a loaded core) priced a class at 0 s or less, missing
    # and the how says so
    excess_how = dict(pf.plumbing_how)["prefill_in_service_excess"]
    if "prefill_in_service_excess" in pf.plumbing.missing:
        assert set(pf.plumbing.missing) == waits | {"prefill_in_service_excess"}
        assert excess_how.startswith("not measured: the profile's curve prices")
    else:
        assert set(pf.plumbing.missing) == waits
        assert "over the profile's curve" in excess_how and "forward_cpu_s" in excess_how
    # the terms beyond the passes are read against the nodes' own passes, not the curve's
    assert "as the prefill node counted them" in dict(pf.plumbing_how)["prefill_per_token_s"]
    # beside it, the prefill node's own engine thread per request in service (said, not stored)
    assert "own engine thread in service (engine_cpu_s), per request: 64 tokens" in excess_how
    per_decoding_how = dict(pf.plumbing_how)["first_token_wait_per_decoding_s"]
    assert "neither stored" in per_decoding_how
    assert "### lognormal (seeds 99" in stdout and "| all terms |" in stdout
    # The saved run simulated again (no live run): the same simulator side, every variant.
    again = subprocess.run(
        [sys.executable, str(BENCH), "--resimulate", str(out), "--json", str(tmp_path / "re.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    (redone,) = json.loads((tmp_path / "re.json").read_text())["rows"]
    assert redone["burst"]["sim_rps"] == row["burst"]["sim_rps"]
    assert redone["capacity"]["sim_rps"] == row["capacity"]["sim_rps"]
    (re_point,) = redone["loads"].values()
    assert re_point["variants"] == point["variants"] and re_point["live"] == point["live"]
    assert re_point["sim_decode"] == point["sim_decode"]
