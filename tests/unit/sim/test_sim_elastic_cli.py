"""``prfaas sim FILE`` with an ``autoscale:`` section: the elastic-pool simulator's JSON and plot,
and bad ``autoscale:`` input -> one line naming the field, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from prfaas.cli import main

pytestmark = pytest.mark.timeout(60)

BASE: dict[str, Any] = {
    "engine": {"kind": "timed", "model": "paper-1t"},
    "policy": {"router": "threshold", "threshold_tokens": 8192},
    "sites": [
        {"name": "remote", "kind": "prfaas", "hardware": "h200", "prefill_nodes": 1},
        {"name": "pd", "kind": "pd", "hardware": "h20", "prefill_nodes": 4, "decode_nodes": 1},
    ],
    "links": [{"src": "remote", "dst": "pd", "gbps": 100}],
    "workload": {"arrival": {"kind": "poisson", "rate_rps": 2.0}, "duration_s": 900},
    "autoscale": {
        "max_nodes": 6, "down_cooldown_s": 30, "down_stabilisation_s": 30,
        "prior_tokens_per_s": 13000,
        "groups": [
            {"name": "spot", "spot": True, "usd_per_hour": 10, "notice_s": 30, "startup_s": 60,
             "preemption": {"trace": "1101", "interval_s": 120}},
            {"name": "on-demand", "startup_s": 60},
        ],
        "load": {"kind": "burst", "factor": 4, "period_s": 600, "burst_s": 120, "offset_s": 200},
    },
}  # fmt: skip


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "elastic.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_json_reports_groups_money_events_and_a_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(json.dumps(BASE))
    rc = main(["sim", str(write(tmp_path, doc)), "--json", "--plot", str(tmp_path / "plots")])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "prfaas.sim.elastic/1"
    assert set(out["groups"]) == {"spot", "on-demand"}
    assert out["completed"] == out["requests"] > 0
    assert out["scale_ups"] > 0 and out["preemptions"] > 0 and out["fallbacks"] > 0
    for key in ("starting_h", "busy_h", "idle_h", "usd"):
        assert key in out["groups"]["spot"]
    assert Path(out["plot"]).stat().st_size > 10_000


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"min_nodes": 5, "max_nodes": 3}, "autoscale: Value error, max_nodes (3) must be >= min"),
        ({"down_cooldown_s": -1}, "autoscale.down_cooldown_s:"),
        ({"groups": [{"name": "spot", "spot": True}]}, "usd_per_hour: a spot group needs"),
        ({"groups": [{"name": "spot", "spot": True, "usd_per_hour": 1,
                      "preemption": {"trace": "11x1"}}]},
         "autoscale.groups.0.preemption.trace: Value error, item 2 is 'x', not 0 or 1"),
    ],
)  # fmt: skip
def test_bad_autoscale_input_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], field: str
) -> None:
    doc = json.loads(json.dumps(BASE))
    doc["autoscale"].update(change)
    rc = main(["sim", str(write(tmp_path, doc))])
    err = capsys.readouterr().err
    assert rc == 2
    assert field in err and len(err.strip().splitlines()) == 1, err


def test_plan_prints_the_pool_bound_sim_reports_without_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``prfaas plan --deployment FILE`` for a file with ``autoscale:``: the nodes per interval
    at steady state for the rate over time (labelled a bound that ignores start-up), the figures
    ``prfaas sim FILE`` reports beside its run."""
    path = write(tmp_path, json.loads(json.dumps(BASE)))
    assert main(["sim", str(path), "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)["steady_state_bound"]
    assert main(["plan", "--deployment", str(path), "--json", "--no-capacity"]) == 0
    planned = json.loads(capsys.readouterr().out)["elastic_pool_bound"]
    assert planned["intervals"] == simulated["intervals"] and len(planned["intervals"]) == 3
    assert max(n for _, n in planned["intervals"]) > 0  # the burst needs nodes
    assert "ignores start-up" in planned["note"] and planned["interval_s"] == 300.0
    assert main(["plan", "--deployment", str(path), "--no-capacity"]) == 0
    assert "steady-state bound, nodes per 300 s (ignores start-up):" in capsys.readouterr().out
