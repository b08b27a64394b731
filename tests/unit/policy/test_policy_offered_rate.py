"""``OfferedRate``: tokens/s over a sliding window, over the time elapsed (at least one tick)
before a window has passed; what falls out of the window is forgotten."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prfaas.policy.offered_rate import OfferedRate

pytestmark = pytest.mark.timeout(30)


def test_early_on_the_rate_is_over_the_time_elapsed_but_at_least_a_tick() -> None:
    r = OfferedRate(window_s=60.0, min_span_s=5.0)
    r.add(1.0, 10_000)
    assert r.per_s(1.0) == pytest.approx(2_000.0)  # over one tick, not over 1 s
    assert r.per_s(20.0) == pytest.approx(500.0)  # over the 20 s since the origin
    assert r.per_s(60.0) == pytest.approx(10_000 / 60)
    assert r.per_s(61.5) == 0.0  # out of the window


def test_the_origin_moves_the_early_span() -> None:
    r = OfferedRate(window_s=60.0, min_span_s=5.0, origin_s=100.0)
    r.add(110.0, 3_000)
    assert r.per_s(110.0) == pytest.approx(300.0)


@given(st.lists(st.tuples(st.floats(0, 50), st.integers(0, 10**6)), max_size=40),
       st.floats(50, 200))  # fmt: skip
def test_the_rate_is_what_arrived_within_the_window_over_its_span(
    arrivals: list[tuple[float, int]], now_s: float
) -> None:
    r = OfferedRate(window_s=30.0, min_span_s=2.0)
    for at_s, n in sorted(arrivals):
        r.add(at_s, n)
    within = sum(n for at_s, n in arrivals if at_s >= now_s - 30.0)
    assert r.per_s(now_s) == pytest.approx(within / 30.0)


def test_a_window_or_tick_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="window_s"):
        OfferedRate(0.0, 1.0)
