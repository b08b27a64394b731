"""``commands.plumbing_classes``: what the nodes count over a class (``Counters.since``) read from
the gateway's node reports (``reported_counters``): decode steps summed over the decode nodes,
each node's forward and engine CPU apart, a node that appeared meanwhile counted from 0."""

from __future__ import annotations

from typing import Any

import pytest

from prfaas.commands import plumbing_classes
from prfaas.commands.plumbing_classes import Counters, reported_counters

pytestmark = pytest.mark.timeout(30)


class _Launcher:
    def __init__(self, reports: list[dict[str, Any]]) -> None:
        self.reports = reports

    def nodes(self) -> list[dict[str, Any]]:
        return self.reports


def test_counters_over_a_class_are_the_reports_differences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plumbing_classes.time, "sleep", lambda s: None)
    launcher = _Launcher([
        {"node": "p0", "role": "prefill", "decode_steps": 0, "forward_cpu_s": 1.0,
         "engine_cpu_s": 1.5},
        {"node": "d0", "role": "decode", "decode_steps": 40, "forward_cpu_s": 0.5,
         "engine_cpu_s": 0.75},
    ])  # fmt: skip
    before = reported_counters(launcher, heartbeat_s=0.1)
    assert before.decode_steps == 40  # a prefill node's steps are not a decode node's
    launcher.reports = [
        {"node": "p0", "role": "prefill", "forward_cpu_s": 3.0, "engine_cpu_s": 4.0},
        {"node": "d0", "role": "decode", "decode_steps": 71, "forward_cpu_s": 0.9,
         "engine_cpu_s": 1.25},
        {"node": "d1", "role": "decode", "decode_steps": 5, "forward_cpu_s": 0.25},
    ]  # fmt: skip
    over = reported_counters(launcher, heartbeat_s=0.1).since(before)
    assert over.decode_steps == 36
    assert over.forward_cpu_s == pytest.approx({"p0": 2.0, "d0": 0.4, "d1": 0.25})
    assert over.engine_cpu_s == pytest.approx({"p0": 2.5, "d0": 0.5, "d1": 0.0})
    assert isinstance(over, Counters)
