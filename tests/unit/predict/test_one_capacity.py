"""One capacity (issue 20 item 2): the simulator's rule sees cores shared by a site's nodes (a
decode node slowed by sharing grows its batch without ever filling it: counted as backlog
growth), searches a trace at rescaled rates, and ``prfaas plan --deployment`` prints the same
figure with what Eqs. 1-8 leave out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prfaas.cli import main
from prfaas.sim import MaxRateRule, SimScenario, SimSite, find_max_rate
from prfaas.sim.scenario import LengthConfig

pytestmark = pytest.mark.timeout(120)


def _site_capacity(shared_cores: int | None) -> float:
    site = SimSite("pd", "pd", "h20", 1, 1, shared_cores=shared_cores)
    sc = SimScenario(
        sites=(site,), policy="local_only", prefix_cache=False, output_tokens=64,
        lengths=LengthConfig(mu=7.0, sigma=1.0, min_tokens=128, max_tokens=4096),
        prefill_token_budget=1, stratified=True, slo_tpot_s=1.0,
    )  # fmt: skip
    return find_max_rate(sc, 1.0, MaxRateRule(num_requests=1000)).max_rate_rps


def test_shared_cores_lower_the_capacity() -> None:
    """The issue's case: a loose decode SLO (the slowed decode step still meets it), so only the
    backlog can tell. One core for a prefill node and a decode node that is busy nearly all the
    time: the prefill runs at half speed, the capacity halves (it used to read as unshared: the
    prefill probe added service at the node's own speed)."""
    alone, shared = _site_capacity(None), _site_capacity(1)
    assert 0.45 < shared / alone < 0.55


def test_trace_capacity_at_rescaled_rates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        json.dumps({"timestamp": 50 * i, "input_length": 2000 + 700 * (i % 9),
                    "output_length": 32, "hash_ids": []})
        for i in range(300)
    ]  # fmt: skip
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["sim", "--deployment", "paper-homogeneous", "--trace", str(trace), "--find-max-rate",
            "--max-rate-requests", "300", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"] == "trace" and out["capacity_rps"] == out["max_rate_rps"] > 0
    rates = {round(t["rate_rps"], 6) for t in out["trials"]}
    assert len(rates) > 3  # the trace really was replayed at several rates
    assert any(t["passed"] for t in out["trials"]) and any(not t["passed"] for t in out["trials"])


def test_plan_prints_the_files_capacity_and_what_eqs_leave_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(
        "engine: {kind: timed, model: paper-1t}\npolicy: {router: local_only}\nsites:\n"
        "  - {name: pd, kind: pd, hardware: h20, prefill_nodes: 1, decode_nodes: 1}\n"
        "workload: {output_tokens: 64, lengths: {mu: 7.0, sigma: 1.0, max_tokens: 4096}}\n"
        "simulation: {prefill_token_budget: 1}\n",
        encoding="utf-8",
    )
    assert main(["plan", "--deployment", str(path), "--json"]) == 0
    cap = json.loads(capsys.readouterr().out)["capacity"]
    assert cap["capacity_rps"] == pytest.approx(cap["lambda_max_exact_eqs_1_8"], rel=0.05)
    assert any("prefill batching" in line for line in cap["eqs_1_8_leave_out"])


def test_measured_plumbing_puts_ceilings_on_the_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import prfaas.scenarios as scenarios
    from prfaas.capacity import plumbing_bounds
    from prfaas.config import load_deployment
    from prfaas.perf.plumbing import PlumbingCosts

    path = tmp_path / "d.yaml"
    path.write_text(
        "engine: {kind: timed, model: paper-1t}\npolicy: {router: local_only}\nsites:\n"
        "  - {name: pd, kind: pd, hardware: h20, prefill_nodes: 1, decode_nodes: 2}\n"
        "workload: {output_tokens: 100, lengths: {kind: fixed, fixed_tokens: 1000}}\n",
        encoding="utf-8",
    )
    d = load_deployment(path)
    sc = scenarios.sim_scenario(d)
    assert plumbing_bounds(d, sc) == ()  # nothing measured: no ceiling
    real = scenarios.site_cost_model
    terms = PlumbingCosts(
        0.01,
        0.005,
        1e-9,
        0.001,
        0.02,
        0.0002,
        prefill_per_token_s=4e-6,
        prefill_in_service_excess=0.5,
        missing=(),
    )

    def measured(dep, site):  # type: ignore[no-untyped-def]
        cm = real(dep, site)
        assert cm is not None
        return dataclasses.replace(cm, plumbing=terms)

    monkeypatch.setattr(scenarios, "site_cost_model", measured)
    kv = real(d, d.home_site).kv_bytes(1000)  # type: ignore[union-attr]
    bounds = {b.what: b.rate_rps for b in plumbing_bounds(d, sc)}
    assert bounds["gateway CPU (one process)"] == pytest.approx(1 / (0.02 + 0.0002 * 100))
    decode_s = 0.005 + 1e-9 * kv + 0.001 * 100
    assert bounds["decode nodes' CPU beyond their steps"] == pytest.approx(2 / decode_s)
    passes_s = real(d, d.home_site).prefill_s(1000)  # type: ignore[union-attr]
    assert bounds["prefill nodes' CPU beyond their curve"] == pytest.approx(
        1 / (0.01 + 4e-6 * 1000 + 0.5 * passes_s)
    )
    # One engine at the site (a vLLM server): a local prefill installs nothing, so under
    # local_only the decode ceiling is its relay alone; over t, every prompt installs again.
    one = dataclasses.replace(sc, sites=(dataclasses.replace(sc.sites[0], local_kv_in_place=True),))
    decode = "decode nodes' CPU beyond their steps"
    assert {b.what: b.rate_rps for b in plumbing_bounds(d, one)}[decode] == pytest.approx(
        2 / (0.001 * 100)
    )
    offloading = dataclasses.replace(one, policy="prfaas", threshold_tokens=500)
    assert {b.what: b.rate_rps for b in plumbing_bounds(d, offloading)}[decode] == pytest.approx(
        2 / decode_s
    )
