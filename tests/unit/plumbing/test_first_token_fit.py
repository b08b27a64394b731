"""The first token's two waits from the probes' gaps (``perf.first_token_fit``): a line by
non-negative least squares, intercept ``first_token_wait_s``, slope
``first_token_wait_per_decoding_s``; where the free line would make one negative, it is held at
0, the other fitted alone, and ``how`` says so; one count of requests decoding fits nothing."""

from __future__ import annotations

import pytest

from prfaas.perf.first_token_fit import fit_first_token_waits

pytestmark = pytest.mark.timeout(60)

DECODING = [0, 0, 0, 8, 8, 9, 16, 16, 15]


def test_a_line_above_zero_is_the_least_squares_line() -> None:
    gaps = [0.004 + 0.003 * x + e for x, e in zip(DECODING, [1e-4, -1e-4, 0] * 3, strict=True)]
    w = fit_first_token_waits(DECODING, gaps)
    fixed, slope, how = w.alone_s, w.per_decoding_s, w.how
    assert (fixed, slope) == pytest.approx((0.004, 0.003), abs=2e-4)
    assert "unconstrained" not in how and "ms alone" in how


def test_a_negative_intercept_is_held_at_zero_and_the_slope_goes_through_it() -> None:
    gaps = [-0.005 + 0.003 * x for x in DECODING]
    w = fit_first_token_waits(DECODING, gaps)
    fixed, slope, how = w.alone_s, w.per_decoding_s, w.how
    through_zero = sum(x * g for x, g in zip(DECODING, gaps, strict=True)) / sum(
        x * x for x in DECODING
    )
    assert fixed == 0.0 and slope == pytest.approx(through_zero)
    assert "unconstrained: -5 ms" in how


def test_a_falling_gap_is_no_growth_and_its_mean_the_wait() -> None:
    gaps = [0.006 - 0.0001 * x for x in DECODING]
    w = fit_first_token_waits(DECODING, gaps)
    fixed, slope, how = w.alone_s, w.per_decoding_s, w.how
    assert slope == 0.0 and fixed == pytest.approx(sum(gaps) / len(gaps))
    assert "held at 0" in how


def test_one_count_of_requests_decoding_fits_nothing() -> None:
    with pytest.raises(ValueError, match="two or more different counts"):
        fit_first_token_waits([8, 8, 8], [0.01, 0.02, 0.03])
