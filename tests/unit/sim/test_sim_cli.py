"""``prfaas sim`` from the command line: JSON output, and bad input -> one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prfaas.cli import main

TRACE = (
    Path(__file__).resolve().parents[4] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["sim", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_output_schema(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["--duration", "60", "--json", "--link-schedule", "10:20,30:100"], capsys)
    assert rc == 0
    data = json.loads(out)
    assert data["schema"] == "prfaas.sim/1"
    for key in ("requests", "throughput_rps", "goodput_rps", "ttft_s", "tpot_s", "sites", "links"):
        assert key in data
    assert data["requests"]["completed"] == data["requests"]["arrived"] > 0


def test_plot_writes_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, _ = _run(["--duration", "30", "--plot", str(tmp_path), "--json"], capsys)
    assert rc == 0
    for name in ("ttft_cdf.png", "link_utilisation.png", "queue_depths.png"):
        assert (tmp_path / name).stat().st_size > 1000


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--rate", "-1"], "--rate"),
        (["--deployment", "paper-homogeneous", "--n-d", "0", "--n-p", "3"], "no decode node"),
        (["--n-d", "0"], "no decode node"),
        (["--link-gbps", "0"], "--link-gbps"),
        (["--deployment", "nope"], "unknown deployment"),
        (["--policy", "magic"], "unknown policy"),
        (["--link-schedule", "10:x"], "--link-schedule"),
        (["--arrival", "zipf"], "arrival"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = _run(["--duration", "10", *argv], capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err


def test_zero_gbps_link_in_use_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(
        "engine: {kind: timed, model: paper-1t}\npolicy: {router: threshold}\nsites:\n"
        "  - {name: pd, kind: pd, hardware: h20, prefill_nodes: 3, decode_nodes: 5}\n"
        "  - {name: far, kind: prfaas, hardware: h200, prefill_nodes: 4}\n"
        "links:\n  - {src: far, dst: pd, gbps: 10}\n",
        encoding="utf-8",
    )
    rc, _, err = _run([str(cfg), "--link-gbps", "0"], capsys)
    assert rc == 2 and "--link-gbps" in err and len(err.strip().splitlines()) == 1


def test_old_scenario_yaml_is_refused_with_how_to_convert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text("sites: []\n", encoding="utf-8")
    rc, _, err = _run(["--config", str(cfg)], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "deployment file" in err and "prefill_nodes" in err and "two_tenants.yaml" in err


def test_malformed_trace_line_names_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    good = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
    trace.write_text(good + good + '{"timestamp": 5, "input_length": "x"}\n', encoding="utf-8")
    rc, _, err = _run(["--trace", str(trace)], capsys)
    assert rc == 2
    assert f"{trace}:3" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(not TRACE.is_file(), reason="Mooncake trace not present")
def test_trace_replay_with_rate_scale(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        ["--trace", str(TRACE), "--trace-limit", "300", "--rate-scale", "2", "--json",
         "--policy", "prfaas"],
        capsys,
    )  # fmt: skip
    assert rc == 0
    data = json.loads(out)
    assert data["requests"]["completed"] == 300
    assert data["sites"]["pd"]["prefix_hit_rate"] > 0


def test_yaml_example_runs_and_flags_override_it(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[3] / "docs" / "examples" / "two_tenants.yaml"
    rc, out, _ = _run([str(example), "--duration", "60", "--json"], capsys)
    assert rc == 0
    data = json.loads(out)
    assert data["scenario"]["arrival"]["kind"] == "poisson"  # from the file
    assert data["scenario"]["seed"] == 3
    assert data["scenario"]["duration_s"] == 60  # from the flag
    assert set(data["links"]) >= {"prfaas->pd-east", "prfaas->pd-west"}
    assert data["requests"]["unfinished"] == 0


@pytest.mark.skipif(not TRACE.is_file(), reason="Mooncake trace not present")
def test_trace_replays_whole_by_default_and_says_how_far_it_went(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The trace's first 2000 records span 669 s: more than the old silent 600 s stop.
    rc, out, _ = _run(["--trace", str(TRACE), "--trace-limit", "2000", "--json"], capsys)
    assert rc == 0
    data = json.loads(out)
    assert data["requests"]["arrived"] == 2000
    assert data["trace"]["replayed"] == data["trace"]["records"] == 2000
    assert data["trace"]["trace_span_s"] > 600
    rc, out, _ = _run(
        ["--trace", str(TRACE), "--trace-limit", "2000", "--duration", "300", "--json"], capsys
    )
    cut = json.loads(out)["trace"]
    assert cut["replayed"] < 2000 and cut["replayed_share"] == cut["replayed"] / 2000
    rc, out, _ = _run(["--trace", str(TRACE), "--trace-limit", "50"], capsys)
    assert "replayed 50 of 50 records (100.0%" in out


def test_requests_csv_has_a_row_per_request_with_its_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import csv

    path = tmp_path / "requests.csv"
    rc, out, _ = _run(["--duration", "40", "--json", "--requests-csv", str(path)], capsys)
    assert rc == 0
    summary = json.loads(out)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == summary["requests"]["completed"]
    offloaded = [r for r in rows if r["offloaded"] == "True"]
    assert len(offloaded) == summary["requests"]["offloaded"]
    assert all(r["prefill_site"] == "prfaas" and int(r["cross_site_bytes"]) > 0 for r in offloaded)
    assert all(r["decode_node"].startswith("pd/") for r in rows)
    ttfts = sorted(float(r["ttft_s"]) for r in rows)
    assert ttfts[len(ttfts) // 2] == pytest.approx(summary["ttft_s"]["p50"], rel=0.05)
    assert all(float(r["e2e_s"]) >= float(r["ttft_s"]) >= float(r["queueing_s"]) >= 0 for r in rows)
    assert (
        _run(["--duration", "5", "--requests-csv", str(tmp_path / "no" / "x.csv")], capsys)[0] == 2
    )


@pytest.mark.parametrize("where", ["folder", "missing"])
def test_requests_csv_path_is_checked_before_the_run(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import prfaas.commands.sim as sim_command

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the simulation ran before its output path was checked")

    monkeypatch.setattr(sim_command, "_run_one", never)
    path = tmp_path if where == "folder" else tmp_path / "no" / "x.csv"
    rc, _, err = _run(["--duration", "3600", "--requests-csv", str(path)], capsys)
    assert rc == 2 and err.count("\n") == 1 and "--requests-csv" in err, err
