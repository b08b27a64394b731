"""The simulator agrees with the analytic model where the paper's assumptions hold.

Uniform arrivals, no prefix cache, output fixed at 1024, the paper's decode constants (25 ms
steps, BS_max 20, from the cost model): ``--find-max-rate`` must land within [0.97, 1.005] of
the planner's exact-service ``lambda_max_exact`` for each of the three deployments. A faithful
simulator cannot beat the exact figure (beyond the search tolerance).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from prfaas.analytic import plan
from prfaas.sim import MaxRateRule, find_max_rate, paper_deployment

# The documented rule, with fewer requests per trial than the CLI default (20,000) to stay fast.
RULE = MaxRateRule(num_requests=12000)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["paper-prfaas", "paper-homogeneous", "paper-naive"])
def test_max_rate_matches_exact_capacity(name: str) -> None:
    result = plan()
    exact = {
        "paper-prfaas": result.prfaas,
        "paper-homogeneous": result.homogeneous,
        "paper-naive": result.naive,
    }[name].lambda_max_exact
    sc = replace(paper_deployment(name), stratified=True)
    found = find_max_rate(sc, start_rps=exact, rule=RULE)
    ratio = found.max_rate_rps / exact
    assert 0.97 <= ratio <= 1.005, (name, ratio, found.trials)
    # The bracket really was closed: one passing and one failing trial around the answer.
    assert any(not t.passed for t in found.trials)
    assert any(t.passed for t in found.trials)


def test_overload_is_detected() -> None:
    """A trial 5% above the exact capacity fails and names the bottleneck stage."""
    from prfaas.sim.maxrate import trial

    exact = plan().homogeneous.lambda_max_exact
    sc = replace(paper_deployment("paper-homogeneous"), stratified=True)
    t = trial(sc, 1.05 * exact, MaxRateRule(num_requests=6000))
    assert not t.passed
    assert t.worst_stage == "prefill:pd"
