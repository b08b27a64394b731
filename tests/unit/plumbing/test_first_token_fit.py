"""The first token's two waits from classes of probes' gaps (``perf.first_token_fit``): the wait
alone is the median gap of the class with nobody decoding, the wait per request decoding the
slope through it of the other classes' medians (through the class with the fewest decoding where
none met nobody); one slow probe moves neither; a negative reading is stored as 0 and said;
classes at one count fit nothing."""

from __future__ import annotations

import pytest

from prfaas.perf.first_token_fit import ProbeGaps, fit_first_token_waits

pytestmark = pytest.mark.timeout(60)


def _class(n: int, gaps_ms: list[float]) -> ProbeGaps:
    return ProbeGaps((n,) * len(gaps_ms), tuple(g / 1e3 for g in gaps_ms))


def test_each_wait_is_read_from_the_class_that_isolates_it() -> None:
    w = fit_first_token_waits([
        _class(0, [4.1, 3.9, 4.0]), _class(8, [28.0, 27.9, 28.1]), _class(16, [52.0, 52.1, 51.9]),
    ])  # fmt: skip
    assert (w.alone_s, w.per_decoding_s) == pytest.approx((0.004, 0.003))
    assert "4 ms at 0 decoding" in w.how and "stored 0" not in w.how


def test_a_slow_probe_moves_neither() -> None:
    steady = [_class(0, [10.0] * 5), _class(8, [34.0] * 5), _class(16, [58.0] * 5)]
    slow = [_class(0, [10.0] * 4 + [400.0]), _class(8, [34.0] * 4 + [900.0]), steady[2]]
    a, b = fit_first_token_waits(steady), fit_first_token_waits(slow)
    assert (b.alone_s, b.per_decoding_s) == pytest.approx((a.alone_s, a.per_decoding_s))


def test_the_per_request_wait_goes_through_the_wait_alone() -> None:
    # Two batched classes off one line: least squares through (0, alone).
    w = fit_first_token_waits([_class(0, [5.0]), _class(8, [21.0]), _class(16, [53.0])])
    assert w.per_decoding_s == pytest.approx((8 * 16 + 16 * 48) / (64 + 256) / 1e3)


def test_negative_readings_are_stored_as_zero_and_said() -> None:
    w = fit_first_token_waits([_class(0, [-3.0]), _class(8, [-10.0]), _class(16, [-20.0])])
    assert (w.alone_s, w.per_decoding_s) == (0.0, 0.0)
    assert "read negative, stored 0: alone, per request" in w.how


def test_where_no_class_met_nobody_the_fewest_anchors_the_line() -> None:
    # The simulator's probes overlapped (a slow site): 2 decoding at the least.
    w = fit_first_token_waits([_class(2, [10.0]), _class(8, [28.0]), _class(16, [52.0])])
    assert (w.alone_s, w.per_decoding_s) == pytest.approx((0.004, 0.003))


@pytest.mark.parametrize("classes", [[_class(0, [5.0]), _class(0, [6.0])], []])
def test_classes_at_one_count_fit_nothing(classes: list[ProbeGaps]) -> None:
    with pytest.raises(ValueError, match="no different counts"):
        fit_first_token_waits(classes)
