"""``WaitingRoom``: expected wait against a deadline and against the alternative."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prfaas.policy.waiting_room import WaitingRoom, WaitVerdict

pytestmark = pytest.mark.timeout(60)

times = st.floats(0, 1e4, allow_nan=False)
maybe_s = st.one_of(st.none(), st.floats(0, 1e3, allow_nan=False))


def test_a_path_that_is_there_is_served() -> None:
    d = WaitingRoom(10).decide(arrived_s=0, now_s=5, missing=None)
    assert d.verdict is WaitVerdict.SERVE


def test_unknown_return_waits_in_steps_then_refuses_with_the_reason() -> None:
    room = WaitingRoom(max_wait_s=1.0, recheck_s=0.25)
    d = room.decide(arrived_s=10, now_s=10, missing="no decode node in rotation")
    assert d.verdict is WaitVerdict.WAIT and d.recheck_at_s == pytest.approx(10.25)
    d = room.decide(arrived_s=10, now_s=10.9, missing="no decode node in rotation")
    assert d.verdict is WaitVerdict.WAIT and d.recheck_at_s == pytest.approx(11.0)  # the deadline
    d = room.decide(arrived_s=10, now_s=11.0, missing="no decode node in rotation")
    assert d.verdict is WaitVerdict.REFUSE
    assert d.reason == "no decode node in rotation (waited 1 s for a path)"


def test_a_known_return_past_the_deadline_is_refused_at_once() -> None:
    d = WaitingRoom(5).decide(arrived_s=0, now_s=1, missing="x", expected_path_s=30)
    assert d.verdict is WaitVerdict.REFUSE and "expected back in 30.0 s" in d.reason


def test_a_starting_node_is_waited_for_only_while_it_beats_the_local_prefill() -> None:
    room = WaitingRoom(60)
    # 20 s of start-up left, then 2 s of prefill there, against 40 s of local prefill: wait.
    d = room.decide(arrived_s=0, now_s=0, missing="node starting", expected_path_s=22,
                    alternative_s=40)  # fmt: skip
    assert d.verdict is WaitVerdict.WAIT and d.recheck_at_s == pytest.approx(22)
    # 150 s of start-up left: local at once.
    d = room.decide(arrived_s=0, now_s=0, missing="node starting", expected_path_s=152,
                    alternative_s=40)  # fmt: skip
    assert d.verdict is WaitVerdict.ALTERNATIVE
    # Not predicted: the alternative.
    d = room.decide(arrived_s=0, now_s=0, missing="node starting", alternative_s=40)
    assert d.verdict is WaitVerdict.ALTERNATIVE


BAD = [{"max_wait_s": -1.0}, {"recheck_s": 0.0}, {"max_wait_s": float("inf")}]


@pytest.mark.parametrize("bad", BAD)
def test_bad_settings_name_the_field(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        WaitingRoom(**bad)


@given(arrived=times, waited=st.floats(0, 100, allow_nan=False), limit=st.floats(0, 60),
       expected=maybe_s, alternative=maybe_s)  # fmt: skip
def test_never_waits_past_the_deadline_nor_refuses_with_an_alternative(
    arrived: float, waited: float, limit: float, expected: float | None,
    alternative: float | None,
) -> None:  # fmt: skip
    room = WaitingRoom(limit)
    now = arrived + waited
    d = room.decide(arrived_s=arrived, now_s=now, missing="m", expected_path_s=expected,
                    alternative_s=alternative)  # fmt: skip
    if d.verdict is WaitVerdict.WAIT:
        assert d.recheck_at_s is not None
        assert now < d.recheck_at_s <= room.deadline_s(arrived)
        if alternative is not None:  # waits only for what beats the alternative
            assert expected is not None and expected < alternative
    if alternative is not None:
        assert d.verdict is not WaitVerdict.REFUSE
    if now >= room.deadline_s(arrived):
        assert d.verdict is not WaitVerdict.WAIT
