"""``plan_notice``: in the node's order, keep each prefill expected to end by the deadline after
those kept before it; hand back the rest (which then cost the node nothing)."""

from __future__ import annotations

import pytest

from prfaas.policy.notice import HeldPrefill, plan_notice

pytestmark = pytest.mark.timeout(30)


def test_the_computing_one_and_the_queue_up_to_the_deadline_are_kept() -> None:
    held = [HeldPrefill("a", 1.0, done_s=0.5), HeldPrefill("b", 1.0), HeldPrefill("c", 1.0)]
    plan = plan_notice(held, now_s=10.0, deadline_s=12.0)
    assert plan.finish == ("a", "b") and plan.hand_back == ("c",)
    assert plan.expected_end_s == pytest.approx(11.5)


def test_a_long_one_handed_back_lets_a_short_one_after_it_finish() -> None:
    held = [HeldPrefill("long", 5.0), HeldPrefill("short", 0.5)]
    plan = plan_notice(held, now_s=0.0, deadline_s=1.0)
    assert plan.finish == ("short",) and plan.hand_back == ("long",)


def test_nothing_held_and_a_zero_notice() -> None:
    assert plan_notice([], 3.0, 3.0).expected_end_s == 3.0
    plan = plan_notice([HeldPrefill("a", 0.1)], now_s=3.0, deadline_s=3.0)
    assert plan.hand_back == ("a",)
    with pytest.raises(ValueError, match="expected_s"):
        HeldPrefill("x", -1.0)
