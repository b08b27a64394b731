"""``prfaas bench --deployment --requests-csv --perfetto`` against a live deployment (gateway and
timed nodes as separate ``prfaas serve`` processes): every request's row carries the route the
gateway's log gives it (node, site, offloaded, bytes crossed, prefix hit), the CSV parses with the
columns ``prfaas sim`` writes, and the trace passes the schema check."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from control_helpers import Cluster, cluster

from prfaas.cli import main
from prfaas.workload.request_columns import COLUMNS, parse_rows
from trace_schema import check_trace

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("bench-export")) as c:
        yield c


def _trace(path: Path) -> Path:
    # Two long prompts (offloaded past t = 8192) sharing 16 blocks, then two short (local) ones
    # sharing 2, each pair 0.3 s apart so the second finds the first's prefix stored; and the
    # same short prompt twice (equal digests: matched in order).
    rows = [
        {"timestamp": 0, "input_length": 9000, "output_length": 4, "hash_ids": list(range(18))},
        {"timestamp": 300, "input_length": 9000, "output_length": 4,
         "hash_ids": [*range(16), 90, 91]},
        {"timestamp": 600, "input_length": 1200, "output_length": 4, "hash_ids": [50, 51, 52]},
        {"timestamp": 900, "input_length": 1200, "output_length": 4, "hash_ids": [50, 51, 53]},
        {"timestamp": 1200, "input_length": 700, "output_length": 3, "hash_ids": [60, 61]},
        {"timestamp": 1500, "input_length": 700, "output_length": 3, "hash_ids": [60, 61]},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_carry_the_gateway_routes_and_the_trace_opens(
    live: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_path, trace_path = tmp_path / "requests.csv", tmp_path / "trace.json"
    status = main([
        "bench", "--json", "--no-progress", "--deployment", str(live.path),
        "--trace", str(_trace(tmp_path / "t.jsonl")), "--requests-csv", str(csv_path),
        "--perfetto", str(trace_path),
    ])  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["completed"] == 6
    assert "6 requests, 6 with their route" in captured.err
    with csv_path.open() as f:
        assert f.readline().strip() == ",".join(COLUMNS)
    rows = parse_rows(csv_path.read_text().splitlines())
    assert [r.index for r in rows] == list(range(6))
    assert all(r.outcome == "ok" and r.queueing_s is None for r in rows)
    nodes = {n["name"] for s in live.config["sites"] for n in s["nodes"]}
    for r in rows:
        assert r.prefill_node in nodes and r.decode_node == "d0", r
        assert r.ttft_s is not None and r.e2e_s is not None and 0 < r.ttft_s <= r.e2e_s
        assert r.offloaded == (r.num_prompt_tokens > 8192 and r.prefill_site == "prfaas"), r
    long, short = rows[:2], rows[2:]
    assert all(r.offloaded and r.prefill_site == "prfaas" for r in long)
    assert all(r.cross_site_bytes and r.cross_site_bytes > 0 for r in long)
    assert all(not r.offloaded and r.cross_site_bytes == 0 for r in short)
    assert rows[0].num_cached_tokens == 0 and (rows[1].num_cached_tokens or 0) >= 16 * 512 - 512
    assert rows[1].prefix_hit == pytest.approx((rows[1].num_cached_tokens or 0) / 9000)
    spans = check_trace(json.loads(trace_path.read_text()))
    assert sorted(e["cat"] for e in spans) == ["decode"] * 6 + ["to_first_token"] * 6
    meta = json.loads(trace_path.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert {"node pf0", "node d0"} <= tracks


def test_without_the_deployment_rows_have_no_route(
    live: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_path = tmp_path / "requests.csv"
    status = main([
        "bench", "--json", "--no-progress", "--url", live.url, "--num-requests", "3",
        "--rate", "20", "--min-tokens", "64", "--max-tokens", "256", "--mu", "5",
        "--output-tokens", "2", "--requests-csv", str(csv_path),
    ])  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "give --deployment" in captured.err
    rows = parse_rows(csv_path.read_text().splitlines())
    assert len(rows) == 3
    assert all(r.prefill_node is None and r.offloaded is None and r.ttft_s for r in rows)


def test_a_wrong_key_exits_2_before_the_load(
    live: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad-key.yaml"
    bad.write_text(yaml.safe_dump({**live.config, "psk": "another-key-0123456789"}))
    status = main(["bench", "--deployment", str(bad), "--num-requests", "2",
                   "--requests-csv", str(tmp_path / "x.csv")])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and "refused the key" in err and "Traceback" not in err
    assert not (tmp_path / "x.csv").exists()
