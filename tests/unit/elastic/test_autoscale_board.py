"""The gateway's ``AutoscaleBoard``: a posted decision sets the desired-size gauge KEDA reads and
counts the decision by its bounded reason code; the last decision and the last add or drain per
group are kept for ``prfaas status``; an unknown code is refused by name."""

from __future__ import annotations

import pytest

from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.gateway.autoscale_board import AutoscaleBoard, AutoscaleReport

pytestmark = pytest.mark.timeout(30)


def report(action: str, code: str, desired: int, at: float) -> AutoscaleReport:
    return AutoscaleReport(group="prfaas", action=action, num_nodes=0 if action == "hold" else 1,
                           desired_nodes=desired, reason=f"{action} because", code=code,
                           at_unix_s=at)  # fmt: skip


def test_decisions_set_the_gauge_count_by_code_and_keep_the_last() -> None:
    metrics = GatewayMetrics()
    board = AutoscaleBoard(metrics)
    board.record(report("add", "load_up", 3, 1.0))
    board.record(report("hold", "in_flight", 3, 2.0))
    board.record(report("hold", "in_flight", 2, 3.0))
    text = metrics.render().decode()
    assert 'prfaas_autoscale_desired_nodes{group="prfaas"} 2.0' in text
    assert ('prfaas_autoscale_decisions_total{action="hold",group="prfaas",reason="in_flight"} 2.0'
            in text)  # fmt: skip
    assert 'action="add",group="prfaas",reason="load_up"} 1.0' in text
    (row,) = board.rows()
    assert row["action"] == "hold" and row["at_unix_s"] == 3.0
    change = row["last_change"]
    assert isinstance(change, dict) and change["action"] == "add" and change["at_unix_s"] == 1.0


def test_preemptions_count_what_each_report_adds_and_survive_a_loop_restart() -> None:
    metrics = GatewayMetrics()
    board = AutoscaleBoard(metrics)
    for n in (0, 2, 2, 3, 1):
        counts = {"prfaas": n}
        board.record(report("hold", "in_flight", 1, 0.0).model_copy(update={"preemptions": counts}))
    # 3 from the first loop, then 1 from a restarted one (its count began again at 0)
    assert 'prfaas_autoscale_preemptions_total{group="prfaas"} 4.0' in metrics.render().decode()
    (row,) = board.rows()
    assert row["preempted"] == 1


def test_an_unknown_reason_code_is_refused_by_name() -> None:
    board = AutoscaleBoard(GatewayMetrics())
    with pytest.raises(ValueError, match="code: 'because'"):
        board.record(report("hold", "because", 1, 0.0))
    assert board.rows() == []
