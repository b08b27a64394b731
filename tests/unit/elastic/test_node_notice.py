"""A node process's ``NoticeDesk``: what its prefills are expected to take (the estimate scaled by
what finished ones measured, or measured seconds per token where nothing prices them), which a
notice keeps and hands back, counted; and the spot group's notice a node added to it takes."""

from __future__ import annotations

import pytest

from prfaas.config import DeploymentConfig
from prfaas.serve.node.notice import NoticeDesk

pytestmark = pytest.mark.timeout(30)


def test_a_notice_keeps_what_ends_in_time_and_hands_back_the_rest() -> None:
    desk = NoticeDesk(lambda tokens, _kv: tokens / 1000)  # 1 s per 1000 tokens, priced
    for i, rid in enumerate(["a", "b", "c", "d"]):
        desk.arrived(rid, 1000, 10, now_s=float(i) / 10)
    desk.started("a", now_s=1.0)
    plan = desk.notice(now_s=1.5, deadline_s=3.8)  # a: 0.5 s left, b: 1 s (3.0 < 3.8 - 0.23)
    assert plan.finish == ("a", "b") and plan.hand_back == ("c", "d")
    assert desk.num_held == 2 and desk.num_handed_back == 2
    desk.ended("a", True, now_s=2.0)
    desk.ended("b", False, now_s=2.1)  # failed: not counted as finished
    assert desk.num_finished == 1 and desk.num_held == 0


def test_the_deadline_hands_back_what_is_still_held() -> None:
    desk = NoticeDesk(lambda tokens, _kv: tokens / 1000)
    for rid in ("a", "b", "c"):
        desk.arrived(rid, 1000, 10, now_s=0.0)
    desk.started("a", now_s=0.0)
    plan = desk.notice(now_s=0.5, deadline_s=3.0)  # keeps a and b, hands c back
    assert plan.finish == ("a", "b") and desk.num_handed_back == 1
    desk.ended("a", True, now_s=1.0)
    assert desk.deadline_came() == ("b",)  # b ran late: handed back, not cut
    assert desk.num_held == 0 and desk.num_handed_back == 2 and desk.num_finished == 1
    assert desk.deadline_came() == ()


def test_measured_prefills_correct_the_estimate() -> None:
    desk = NoticeDesk(lambda tokens, _kv: tokens / 1000)
    desk.arrived("a", 1000, 0, 0.0)
    desk.started("a", 0.0)
    desk.ended("a", True, 3.0)  # took 3x the estimate
    assert desk.expected_s(1000, 0) > 1.0
    unpriced = NoticeDesk(lambda _t, _kv: 0.0)  # a real engine with no cost model
    assert unpriced.expected_s(1000, 0) == 0.0
    unpriced.arrived("a", 100, 0, 0.0)
    unpriced.started("a", 0.0)
    unpriced.ended("a", True, 1.0)
    assert unpriced.expected_s(1000, 0) == pytest.approx(10.0)


def test_the_spot_group_notice_goes_to_the_nodes_added_to_it() -> None:
    auto = DeploymentConfig.model_validate({
        "engine": {"kind": "timed", "model": "paper-1t"},
        "sites": [{"name": "pf", "kind": "prfaas", "hardware": "h200",
                   "nodes": [{"name": "pf0", "role": "prefill"}]},
                  {"name": "pd", "kind": "pd", "hardware": "h20",
                   "nodes": [{"name": "d0", "role": "decode"}]}],
        "links": [{"src": "pf", "dst": "pd", "gbps": 100}],
        "psk": "unit-test-key-0123456789",
        "autoscale": {"groups": [{"name": "spot", "spot": True, "usd_per_hour": 12,
                                  "notice_s": 30}, {"name": "od"}]},
    }).autoscale  # fmt: skip
    assert auto is not None
    assert auto.spot_notice_s("pf", "pf-spot-3") == 30
    assert auto.spot_notice_s("pf", "pf-od-0") is None  # on-demand: SIGTERM stops it
    assert auto.spot_notice_s("pf", "pf0") is None and auto.spot_notice_s("pf", "pf-spot-x") is None
