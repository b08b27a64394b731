"""analytic: the paper's case study reproduced, and properties of the model that can fail."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas.analytic import (
    EmpiricalLengths,
    Planner,
    Scenario,
    TruncatedLogNormal,
    mean,
    mean_above,
    plan,
    prob_above,
)
from prfaas.analytic.throughput import (
    lambda_max,
    local_moments,
    offload_moments,
    theta_pdp,
    theta_prfaas,
)


@pytest.fixture(scope="module")
def case_study():  # type: ignore[no-untyped-def]
    return plan()


def test_prfaas_pd_matches_table6(case_study) -> None:  # type: ignore[no-untyped-def]
    pf = case_study.prfaas
    assert 18_500 <= pf.threshold_tokens <= 20_500
    assert (pf.n_prfaas, pf.n_p, pf.n_d) == (4, 3, 5)
    assert pf.lambda_max == pytest.approx(3.24, rel=0.03)
    assert abs(pf.p_offload - 0.496) <= 0.01
    assert 11 <= pf.egress_gbps <= 14
    assert pf.ttft_mean_s == pytest.approx(2.22, rel=0.05)
    assert pf.ttft_p90_s == pytest.approx(3.51, rel=0.05)


def test_baselines_match_table6(case_study) -> None:  # type: ignore[no-untyped-def]
    ho, na = case_study.homogeneous, case_study.naive
    assert (ho.n_p, ho.n_d) == (9, 3)
    assert ho.lambda_max == pytest.approx(2.11, rel=0.02)
    assert ho.ttft_mean_s == pytest.approx(4.44, rel=0.05)
    assert ho.ttft_p90_s == pytest.approx(9.73, rel=0.05)
    assert na.lambda_max == pytest.approx(2.45, rel=0.03)
    assert (na.n_prfaas, na.n_d) == (4, 8)
    assert abs(case_study.prfaas_vs_homogeneous - 1.54) <= 0.05
    assert abs(case_study.prfaas_vs_naive - 1.32) <= 0.06


def test_exact_service_capacity_is_below_the_shortcut_by_the_expected_margin(
    case_study,  # type: ignore[no-untyped-def]
) -> None:
    # An independent calculation put the shortcut's overstatement at about 1%, 4% and 5%.
    gaps = [
        1 - d.lambda_max_exact / d.lambda_max
        for d in (case_study.prfaas, case_study.homogeneous, case_study.naive)
    ]
    assert [round(g, 2) for g in gaps] == pytest.approx([0.01, 0.04, 0.05], abs=0.011)


def test_optimum_satisfies_eqs_7_and_8_and_equal_cost_gain(case_study) -> None:  # type: ignore[no-untyped-def]
    assert case_study.check.eq7_holds and case_study.check.eq8_holds
    assert case_study.equal_cost_gain == pytest.approx(1.15, abs=0.03)


def test_fixed_threshold_outside_range_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the length range"):
        plan(threshold_tokens=200_000)
    fixed = plan(threshold_tokens=30_000)
    assert fixed.prfaas.threshold_tokens == 30_000


def test_lognormal_closed_forms_match_the_paper_numbers() -> None:
    d = TruncatedLogNormal()
    assert mean(d) == pytest.approx(27_486, rel=1e-3)
    assert float(prob_above(d, 19_400)) == pytest.approx(0.496, abs=0.001)
    assert float(mean_above(d, 19_400)) == pytest.approx(45_000, rel=0.01)
    assert d.partial_expect(lambda x: x, 0, 1e9) == pytest.approx(mean(d), rel=1e-7)


@settings(max_examples=30, deadline=None)
@given(st.floats(7.0, 11.0), st.floats(0.3, 2.0), st.floats(200, 100_000), st.floats(200, 100_000))
def test_p_falls_and_conditional_mean_rises_with_t(
    mu: float, sigma: float, t1: float, t2: float
) -> None:
    d = TruncatedLogNormal(mu, sigma)
    lo, hi = sorted((t1, t2))
    assert float(prob_above(d, hi)) <= float(prob_above(d, lo)) + 1e-12
    if float(prob_above(d, hi)) > 1e-9:
        assert float(mean_above(d, hi)) >= float(mean_above(d, lo)) - 1e-6


@settings(max_examples=6, deadline=None)
@given(st.floats(8.0, 10.5), st.floats(0.5, 1.5), st.floats(1_000, 60_000), st.integers(0, 2**31))
def test_conditional_moments_match_monte_carlo(
    mu: float, sigma: float, t: float, seed: int
) -> None:
    d = TruncatedLogNormal(mu, sigma)
    x = d.sample(np.random.default_rng(seed), 200_000).astype(np.float64)
    p_mc = float((x > t).mean())
    se_p = math.sqrt(max(p_mc * (1 - p_mc), 1e-12) / x.size)
    assert abs(float(prob_above(d, t)) - p_mc) <= 5 * se_p + 2e-5  # +rounding to whole tokens
    above = x[x > t]
    if above.size > 1000:
        se = above.std() / math.sqrt(above.size)
        assert abs(float(mean_above(d, t)) - above.mean()) <= 5 * se + 1.0


@settings(max_examples=15, deadline=None)
@given(
    st.floats(8.5, 10.5),
    st.floats(0.4, 1.4),
    st.integers(500, 100_000),
    st.integers(1, 5),
)
def test_exact_service_never_exceeds_shortcut_when_prefill_is_convex(
    mu: float, sigma: float, t: int, n_p: int
) -> None:
    # The shipped profiles are convex in length (H20: quadratic; H200: slopes rise).
    planner = Planner(Scenario(lengths=TruncatedLogNormal(mu, sigma), n_local=6))
    d = planner._deployment("prfaas", t, 4, n_p, 6 - n_p)
    assert d.lambda_max_exact <= d.lambda_max * (1 + 1e-9)


def _brute_force(s: Scenario) -> float:
    planner = Planner(s)
    best = 0.0
    for t, n_p in itertools.product(planner.thresholds(), range(s.n_local)):
        off = offload_moments(s.lengths, planner.remote, t, exact=False)
        loc = local_moments(s.lengths, planner.local, t, exact=False)
        lam = lambda_max(
            theta_prfaas(off, s.n_prfaas, s.link_bytes_per_s),
            theta_pdp(loc, n_p),
            planner._theta_pdd(s.n_local - n_p),
            off.share,
        )
        best = max(best, lam)
    return best


@settings(max_examples=6, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(2, 6),
    st.floats(1.0, 200.0),
    st.floats(8.5, 10.5),
    st.integers(4_000, 20_000),
)
def test_grid_search_is_no_worse_than_brute_force(
    n_prfaas: int, n_local: int, link: float, mu: float, step: int
) -> None:
    s = Scenario(
        n_prfaas=n_prfaas,
        n_local=n_local,
        link_gbps=link,
        lengths=TruncatedLogNormal(mu, 1.0),
        threshold_step_tokens=step,
    )
    assert Planner(s).plan().prfaas.lambda_max >= _brute_force(s) - 1e-9


def test_empirical_lengths_exact_sums_and_errors() -> None:
    d = EmpiricalLengths([100, 200, 300, 400])
    assert float(prob_above(d, 250)) == 0.5 and float(mean_above(d, 250)) == 350
    assert d.partial_expect(lambda x: x * x, 0, 250) == pytest.approx((100**2 + 200**2) / 4)
    with pytest.raises(ValueError, match="at least one"):
        EmpiricalLengths([])
    result = plan(Scenario(lengths=EmpiricalLengths(np.linspace(1000, 60_000, 500))))
    assert result.prfaas.lambda_max >= result.naive.lambda_max
