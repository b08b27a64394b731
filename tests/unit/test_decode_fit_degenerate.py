"""``fit_decode`` on points the context term alone explains (a --quick profile on a loaded core:
fresh-clone CI of 2026-12-07 failed the fidelity bench's tiny run on it)."""

from __future__ import annotations

import pytest

from prfaas.perf.profile_file import DecodePoint, fit_decode

pytestmark = pytest.mark.timeout(30)


def test_a_fit_with_no_fixed_cost_falls_back_to_one_without_the_context_term() -> None:
    # steps exactly proportional to the batch's total context: the full fit has no fixed cost
    points = [DecodePoint(b, c, 1e-6 * b * c) for b in (1, 4) for c in (512, 4096)]
    fit = fit_decode(points)
    assert fit.base_s + fit.per_request_s > 0
    assert fit.per_token_s == 0.0 and "without the context term" in fit.note


def test_an_ordinary_fit_keeps_every_term() -> None:
    points = [
        DecodePoint(b, c, 0.002 + 5e-4 * b + 1e-8 * b * c) for b in (1, 4) for c in (512, 4096)
    ]
    fit = fit_decode(points)
    assert fit.base_s == pytest.approx(0.002, rel=1e-3) and fit.per_token_s == pytest.approx(
        1e-8, rel=1e-3
    )
    assert "without" not in fit.note
