"""A relaying process's CPU split into per request, per step and per token by least squares over
classes at several batch sizes (``perf.relay_fit``), and the profile commands' use of it
(``commands.plumbing_classes.relay_terms``: the fallback where no class made a batch)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas.commands.plumbing_classes import OUTPUT_TOKENS, relay_terms
from prfaas.perf.relay_fit import RelayClass, fit_relay

pytestmark = pytest.mark.timeout(60)

Q, A, C = 0.005, 0.0004, 0.00013
"""Per request, per step, per token (seconds): the fifth vLLM round's sidecar, roughly."""


def _classes(q: float, a: float, c: float, noise: list[float] | None = None) -> list[RelayClass]:
    """The four classes the profile runs: 16 one at a time with 1 and 32 tokens, then 32 tokens 8
    and 32 at once (steps as a server batches them: about the tokens over the batch, plus the
    prefills)."""
    shapes = [
        (16, 16, 16),
        (16, 512, 512),
        (16, 16 + 16 * 31 // 8, 512),
        (64, 64 + 64 * 31 // 32, 2048),
    ]
    noise = noise or [0.0] * len(shapes)
    return [
        RelayClass(n, s, t, (n * q + s * a + t * c) * (1 + e))
        for (n, s, t), e in zip(shapes, noise, strict=True)
    ]


def test_exact_classes_give_the_terms_back() -> None:
    fit = fit_relay(_classes(Q, A, C))
    assert (fit.per_request_s, fit.per_step_s, fit.per_output_token_s) == pytest.approx(
        (Q, A, C), rel=1e-6
    )
    assert max(abs(r) for r in fit.residuals) < 1e-6 and fit.clipped == ()


@settings(deadline=None, max_examples=60)
@given(st.lists(st.floats(-0.03, 0.03), min_size=4, max_size=4))
def test_a_few_percent_of_noise_moves_the_token_term_a_little(noise: list[float]) -> None:
    """Every class off by up to 3% leaves the per-token term within 30% (one batched class put
    the whole split on itself: the term read 0.14 to 0.66 ms between profiles)."""
    fit = fit_relay(_classes(Q, A, C, noise))
    assert fit.per_output_token_s == pytest.approx(C, rel=0.3)
    assert fit.per_request_s == pytest.approx(Q, rel=0.3)
    total = [fit.per_request_s + s / n * fit.per_step_s + t / n * fit.per_output_token_s
             for n, s, t in ((16, 16, 16), (16, 512, 512))]  # fmt: skip
    assert total == pytest.approx([Q + A + C, Q + 32 * (A + C)], rel=0.05)


def test_a_negative_term_is_held_at_zero_and_named() -> None:
    """Batched classes dearer per token than one at a time: the per-step term would be negative."""
    fit = fit_relay(_classes(Q, -0.0002, 0.0006))
    assert fit.per_step_s == 0.0 and fit.clipped == ("per step",)
    assert fit.per_output_token_s > 0 and fit.per_request_s > 0
    assert "per step held at 0" in fit.describe(_classes(Q, -0.0002, 0.0006))


def test_classes_that_do_not_tell_the_terms_apart_are_refused() -> None:
    one_at_a_time = [RelayClass(16, 16 * k, 16 * k, 0.1 * k) for k in (1, 32, 8)]
    with pytest.raises(ValueError, match="batch over 1"):
        fit_relay(one_at_a_time)
    with pytest.raises(ValueError, match="three or more"):
        fit_relay(_classes(Q, A, C)[:2])
    with pytest.raises(ValueError, match=">= 1"):
        RelayClass(16, 0, 16, 0.1)


def test_the_profile_reads_the_fit_and_says_how() -> None:
    classes = [(c.num_requests, c.num_steps, c.num_tokens, {"sidecar": c.cpu_s})
               for c in _classes(Q, A, C)]  # fmt: skip
    req, tok, step, how = relay_terms("sidecar", classes)
    assert (req, step, tok) == pytest.approx((Q, A, C), rel=1e-6)
    assert "least squares over 4 classes" in how and "64 requests" in how


def test_without_a_batch_the_profile_keeps_the_batch1_figures_unsplit() -> None:
    """The batched classes made no batch (each token its own step): per request and one wake-up
    plus one token from the two sequential classes, per step None (left missing)."""
    r = A + C
    classes = [
        (16, 16, 16, {"gateway": 16 * (Q + r)}),
        (16, 512, 512, {"gateway": 16 * (Q + OUTPUT_TOKENS * r)}),
        (16, 512, 512, {"gateway": 16 * (Q + OUTPUT_TOKENS * r)}),
    ]
    req, tok, step, how = relay_terms("gateway", classes)
    assert step is None and "not split" in how
    assert (req, tok) == pytest.approx((Q, r), rel=1e-9)
