"""A cached prefix's cost (``perf.prefill_attention``): fitted from a profile's measured points,
cached ones included, it prices a suffix as its own prefill plus its attention over the prefix,
where the chord rule ``T(c + n) - T(c) + T(0)`` overcharged (the torch profiles' cached points
read 13-31% under it)."""

from __future__ import annotations

import pytest

from prfaas.perf.cost_model import CostModel
from prfaas.perf.prefill_attention import fit_attention_s
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


def _cost(cached_levels: tuple[int, ...]) -> CostModel:
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
        (("source", "torch"), ("pass_tokens", str(PASS_TOKENS))),
    )
    return cost_model_from(pf)


def test_the_fit_recovers_the_attention_and_prices_cached_prefills() -> None:
    cost = _cost((0, 2048))
    assert cost.profile is not None
    assert cost.profile.prefill_attention_s == pytest.approx(GAMMA_S, rel=1e-6)
    for n, c in ((64, 2048), (256, 1024), (1024, 3072), (3000, 5120)):
        assert cost.prefill_s(n, c) == pytest.approx(engine_s(n, c), rel=0.02), (n, c)
    assert cost.prefill_s(1024) == engine_s(1024, 0)  # uncached: the curve through the points


def test_without_cached_points_the_chord_rule_stands() -> None:
    """Nothing measured what a prefix adds: the curve's rule, which overcharges a suffix here
    (the test above's fit is what removes that)."""
    cost = _cost((0,))
    assert cost.profile is not None and cost.profile.prefill_attention_s is None
    curve = cost.profile.prefill
    assert curve is not None
    n, c = 256, 2048
    assert cost.prefill_s(n, c) == curve(c + n) - curve(c) + curve(0)
    assert cost.prefill_s(n, c) > 1.2 * engine_s(n, c)


def test_no_attention_found_is_none() -> None:
    flat = [PrefillPoint(n, c, 0.01 + 1e-5 * n, 0.0, 3) for n, c in ((64, 0), (512, 0), (64, 512))]
    assert fit_attention_s(flat, None) is None
