"""The operator exports: one per-request column set for ``prfaas sim`` and ``prfaas bench``
(both writers give the same header and rows that parse back), the bench rows' join with the
gateway's route log, and the Perfetto trace of a simulation (schema, spans matching the CSV,
lanes that never overlap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prfaas.cli import main
from prfaas.commands.outputs import write_requests_csv
from prfaas.serve.gateway.hashing import prompt_digest
from prfaas.serve.loadgen import BenchRequest, PromptSynth, RequestResult
from prfaas.serve.loadgen.export import live_spans, match_routes, request_rows
from prfaas.sim.perfetto import Span, build_trace
from prfaas.workload.request_columns import COLUMNS, RequestRow, cells, parse_rows
from trace_schema import check_trace

pytestmark = pytest.mark.timeout(60)


def _sim(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    rc = main(["sim", "--duration", "20", "--json", *extra])
    out = capsys.readouterr().out
    assert rc == 0
    result: dict[str, object] = json.loads(out)
    return result


def _result(index: int, sent_s: float, ok: bool = True, n: int = 100) -> RequestResult:
    if not ok:
        return RequestResult(index, n, False, "http_429", 429, sent_s, None, None, 0, ())
    return RequestResult(index, n, True, None, 200, sent_s, 0.25, 1.0, 4, (0.25, 0.25, 0.25))


def _route(req: BenchRequest, synth: PromptSynth, node: str, **kw: object) -> dict[str, object]:
    offloaded = node.startswith("pf")
    return {
        "request_id": f"r-{req.index}-{node}", "prefill_site": "prfaas" if offloaded else "pd",
        "prefill_node": node, "decode_node": "d0", "offloaded": offloaded,
        "num_prompt_tokens": req.num_prompt_tokens, "num_cached_tokens": 0, "kv_bytes": 5000,
        "attempts": 1, "moved_tokens": 0,
        "prompt_digest": prompt_digest(synth.token_ids(req)), **kw,
    }  # fmt: skip


def test_sim_and_bench_write_the_same_header_and_rows_that_parse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim_csv = tmp_path / "sim.csv"
    out = _sim(tmp_path, capsys, "--requests-csv", str(sim_csv))
    sim_rows = parse_rows(sim_csv.read_text().splitlines())
    assert len(sim_rows) == out["requests"]["completed"]  # type: ignore[index]
    assert all(r.outcome == "ok" and r.queueing_s is not None for r in sim_rows)
    synth = PromptSynth(seed=3)
    reqs = [BenchRequest(i, 0.1 * i, 100, 4) for i in range(3)]
    results = [_result(0, 0.0), _result(1, 0.1), _result(2, 0.2, ok=False)]
    routes = [_route(reqs[0], synth, "p0"), _route(reqs[1], synth, "pf0", num_cached_tokens=50)]
    bench_rows = request_rows(results, match_routes(reqs, results, routes, synth))
    bench_csv = tmp_path / "bench.csv"
    write_requests_csv(bench_csv, bench_rows)
    sim_header = sim_csv.read_text().splitlines()[0]
    assert bench_csv.read_text().splitlines()[0] == sim_header == ",".join(COLUMNS)
    assert parse_rows(bench_csv.read_text().splitlines()) == bench_rows  # round trip, None too
    local, offloaded, failed = bench_rows
    assert (local.prefill_node, local.offloaded, local.cross_site_bytes) == ("p0", False, 0)
    assert (offloaded.prefill_site, offloaded.cross_site_bytes) == ("prfaas", 5000)
    assert offloaded.prefix_hit == pytest.approx(0.5)
    assert failed.outcome == "http_429" and failed.prefill_node is None and failed.ttft_s is None


def test_equal_prompts_are_matched_in_send_order_and_text_prompts_not_at_all() -> None:
    synth = PromptSynth(seed=0)
    # The same trace blocks and length: equal prompts, equal digests.
    reqs = [BenchRequest(i, 0.0, 1024, 2, (7, 8)) for i in range(2)]
    results = [_result(1, 0.5), _result(0, 0.1)]  # request 0 was sent first
    routes = [_route(reqs[0], synth, "p0"), _route(reqs[1], synth, "pf0")]
    matched = match_routes(reqs, results, routes, synth)
    assert matched[0]["prefill_node"] == "p0" and matched[1]["prefill_node"] == "pf0"
    assert match_routes(reqs, results, routes[:1], synth).keys() == {0}  # a log that dropped one
    text = PromptSynth(seed=0, prompt_format="text")
    assert match_routes(reqs, results, routes, text) == {}


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (["a,b"], "header"),
        ([",".join(COLUMNS), "1,2"], "line 2"),
        ([",".join(COLUMNS), ",".join(["x"] * len(COLUMNS))], "not a number"),
    ],
)
def test_a_bad_csv_is_refused_naming_where(lines: list[str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_rows(lines)


def test_a_row_whose_bool_is_odd_or_whose_required_cell_is_empty_does_not_parse() -> None:
    row = RequestRow(0, 0.0, 10, None, 1, None, None, None, True, None, None, 0.1, 0.2, None, None)
    good = cells(row)
    assert parse_rows([",".join(COLUMNS), ",".join(good)]) == [row]
    odd = [*good]
    odd[COLUMNS.index("offloaded")] = "yes"
    with pytest.raises(ValueError, match="offloaded"):
        parse_rows([",".join(COLUMNS), ",".join(odd)])
    empty = [*good]
    empty[COLUMNS.index("num_prompt_tokens")] = ""
    with pytest.raises(ValueError, match="num_prompt_tokens"):
        parse_rows([",".join(COLUMNS), ",".join(empty)])


def test_sim_perfetto_has_a_track_per_node_and_link_and_spans_matching_the_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_path, csv_path = tmp_path / "trace.json", tmp_path / "requests.csv"
    out = _sim(tmp_path, capsys, "--perfetto", str(trace_path), "--requests-csv", str(csv_path))
    trace = json.loads(trace_path.read_text())
    spans = check_trace(trace)
    requests = out["requests"]
    cats = [e["cat"] for e in spans]
    assert cats.count("prefill") == cats.count("decode") == requests["completed"]  # type: ignore[index]
    assert cats.count("transfer") == requests["offloaded"] > 0  # type: ignore[index]
    tracks = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
              if e["name"] == "process_name"}  # fmt: skip
    assert "link prfaas->pd" in tracks.values()
    assert any(t.startswith("node prfaas/") for t in tracks.values())
    assert any(t.startswith("node pd/") for t in tracks.values())
    rows = {r.index: r for r in parse_rows(csv_path.read_text().splitlines())}
    for e in spans:
        row = rows[e["args"]["request"]]
        track = tracks[e["pid"]]
        if e["cat"] == "prefill":  # microseconds from the run's start
            assert e["ts"] == pytest.approx((row.arrival_s + (row.queueing_s or 0)) * 1e6, abs=1)
            assert track == f"node {row.prefill_node}"
        elif e["cat"] == "transfer":
            assert row.offloaded and e["args"]["bytes"] == row.cross_site_bytes
            assert e["ts"] + e["dur"] == pytest.approx((row.arrival_s + (row.ttft_s or 0)) * 1e6,
                                                       abs=1)  # fmt: skip
        else:
            assert track == f"node {row.decode_node}"
            assert e["ts"] + e["dur"] == pytest.approx((row.arrival_s + (row.e2e_s or 0)) * 1e6,
                                                       abs=1)  # fmt: skip


def test_lanes_are_as_few_as_the_most_overlapping_spans() -> None:
    # Three spans overlap at t = 2.5; the fourth starts when the first ends: it reuses lane 1.
    spans = [Span("node a", "decode", i, s, e) for i, (s, e) in
             enumerate([(0, 3), (1, 4), (2, 6), (3, 5)])]  # fmt: skip
    events = check_trace(build_trace(spans))
    lane = {e["args"]["request"]: e["tid"] for e in events}
    assert len(set(lane.values())) == 3
    assert lane[3] == lane[0] and len({lane[0], lane[1], lane[2]}) == 3
    assert [e["ts"] for e in events if e["tid"] == lane[0]] == [0, 3e6]


def test_live_spans_follow_the_rows_and_fall_back_to_one_endpoint_track() -> None:
    synth = PromptSynth(seed=1)
    reqs = [BenchRequest(i, 0.0, 100, 4) for i in range(3)]
    results = [_result(0, 0.0), _result(1, 0.5), _result(2, 0.6, ok=False)]
    rows = request_rows(results, match_routes(reqs, results, [_route(reqs[0], synth, "pf0")],
                                              synth))  # fmt: skip
    spans = live_spans(rows)
    assert [(s.track, s.category, s.request) for s in spans] == [
        ("node pf0", "to_first_token", 0), ("node d0", "decode", 0),
        ("endpoint", "to_first_token", 1), ("endpoint", "decode", 1),
    ]  # fmt: skip
    assert (spans[2].start_s, spans[2].end_s, spans[3].end_s) == (0.5, 0.75, 1.5)
    check_trace(build_trace(spans))


def test_sim_perfetto_into_a_missing_folder_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "--duration", "5", "--perfetto", str(tmp_path / "no" / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "--perfetto" in err and "Traceback" not in err


def test_find_max_rate_refuses_the_one_run_exports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "--find-max-rate", "--perfetto", str(tmp_path / "t.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--find-max-rate" in err and "Traceback" not in err
    assert not (tmp_path / "t.json").exists()
