"""A prefill's cost fitted per pass, per token and per attended pair (``perf.prefill_fit``) from a
profile's measured points: where the profile knows its passes it prices every prefill (the curve
between two measured lengths misses a pass begun past a block boundary); otherwise it prices a
cached prefix's attention, where the chord rule ``T(c + n) - T(c) + T(0)`` overcharged (the torch
profiles' cached points read 13-31% under it)."""

from __future__ import annotations

import pytest

from prfaas.perf.cost_model import CostModel
from prfaas.perf.prefill_fit import fit_prefill
from prfaas.perf.prefill_passes import pass_ends
from prfaas.perf.profile_costs import cost_model_from
from prfaas.perf.profile_file import (
    HardwareSection,
    ModelSection,
    PrefillPoint,
    PrefillSection,
    ProfileFile,
)
from prfaas.spec import get_model

pytestmark = pytest.mark.timeout(30)

PASS_TOKENS = 512
ALPHA_S, BETA_S, GAMMA_S = 6e-3, 33e-6, 10.5e-9
"""Per pass, per token, per attended pair: the tiny Qwen3-Next's on one core (2026-12-05)."""


def engine_s(n: int, c: int) -> float:
    """What the engine takes: its passes, its tokens, each new token attending to all before."""
    passes = len(pass_ends(c, c + n, PASS_TOKENS, None))
    return ALPHA_S * passes + BETA_S * n + GAMMA_S * (n * n / 2 + n * c)


def _cost(cached_levels: tuple[int, ...], pass_tokens: int | None = PASS_TOKENS) -> CostModel:
    points = tuple(
        PrefillPoint(n, c, engine_s(n, c), 0.0, 3)
        for c in cached_levels
        for n in (64, 256, 1024, 2048, 4096, 8192)
    )
    pf = ProfileFile(
        ModelSection("tiny", get_model("paper-1t").cache, 1e6, 1e6, 64, 4, 16, 4.0, 16384),
        HardwareSection("h200", 8e9),
        PrefillSection("piecewise-linear", points),
        None,
        (("source", "torch"), *((("pass_tokens", str(pass_tokens)),) if pass_tokens else ())),
    )
    return cost_model_from(pf)


def test_the_fit_recovers_the_engines_terms_and_prices_every_prefill() -> None:
    cost = _cost((0, 2048))
    fit = cost.profile.prefill_fit if cost.profile is not None else None
    assert fit is not None and fit.pass_tokens == PASS_TOKENS
    assert (fit.per_pass_s, fit.per_token_s, fit.attention_s) == pytest.approx(
        (ALPHA_S, BETA_S, GAMMA_S), rel=1e-6
    )
    for n, c in ((64, 2048), (256, 1024), (1024, 3072), (3000, 5120), (1024, 0), (533, 0)):
        assert cost.prefill_s(n, c) == pytest.approx(engine_s(n, c), rel=1e-6), (n, c)


def test_a_prompt_past_a_block_boundary_pays_its_pass() -> None:
    """Only uncached points, at the profile's lengths: the curve between 256 and 1,024 tokens
    prices 533 (a 512-token pass and a 21-token one) as if no pass began past 512; the fit,
    knowing where the engine ends its passes, charges it."""
    cost = _cost((0,))
    curve = cost.profile.prefill if cost.profile is not None else None
    assert curve is not None
    for n, curve_short_by in ((533, 0.1), (1100, 0.05)):
        assert cost.prefill_s(n) == pytest.approx(engine_s(n, 0), rel=1e-6)
        assert curve(n) < (1 - curve_short_by) * engine_s(n, 0)
    assert cost.prefill_s(256, 2048) == pytest.approx(engine_s(256, 2048), rel=1e-6)


def test_one_pass_profiles_without_cached_points_keep_the_chord_rule() -> None:
    """Nothing measured passes or what a prefix adds: the curve's rule, which overcharges a
    suffix here (the fits above are what remove that)."""
    cost = _cost((0,), pass_tokens=None)
    assert cost.profile is not None and cost.profile.prefill_fit is None
    curve = cost.profile.prefill
    assert curve is not None
    n, c = 256, 2048
    assert cost.prefill_s(n, c) == curve(c + n) - curve(c) + curve(0)
    assert cost.prefill_s(n, c) > 1.2 * engine_s(n, c)


def test_no_attention_found_is_none() -> None:
    flat = [PrefillPoint(n, c, 0.01 + 1e-5 * n, 0.0, 3) for n, c in ((64, 0), (512, 0), (64, 512))]
    assert fit_prefill(flat, None) is None


def test_one_pass_profiles_with_cached_points_price_a_prefix_by_the_fitted_attention() -> None:
    """No passes known: an uncached prompt is the curve's (exact at the measured lengths), a
    cached prefix adds the fitted attention."""
    cost = _cost((0, 2048), pass_tokens=None)
    fit = cost.profile.prefill_fit if cost.profile is not None else None
    curve = cost.profile.prefill if cost.profile is not None else None
    assert fit is not None and fit.pass_tokens is None and curve is not None
    assert cost.prefill_s(1024) == curve(1024)
    assert cost.prefill_s(256, 2048) == curve(256) + fit.attention_s * 256 * 2048
