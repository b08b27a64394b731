"""The smarter policies earn their keep, deterministically.

- A link dip (100 -> 5 Gbps for 60 s) under load: the bandwidth-aware ``prfaas`` router keeps the
  peak transfer backlog and the TTFT P99 below the static ``threshold`` router's.
- From a skewed split (6 prefill / 2 decode) under the paper's workload the rebalancer reaches
  the analytic optimum (3 / 5) and throughput rises.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from prfaas.analytic import plan
from prfaas.core.topology import NodeRole
from prfaas.sim import Simulator, paper_deployment, summary


def _dip_run(policy: str) -> dict:  # type: ignore[type-arg]
    lam = plan().prfaas.lambda_max_exact
    sc = paper_deployment("paper-prfaas", rate_rps=0.8 * lam)
    link = replace(sc.links[0], schedule=((60.0, 5.0), (120.0, 100.0)))
    sc = replace(
        sc,
        links=(link,),
        policy=policy,
        duration_s=240.0,
        seed=1,
        arrival=replace(sc.arrival, kind="poisson"),
    )
    sim = Simulator(sc)
    sim.run()
    return summary(sim)


@pytest.mark.timeout(60)
def test_bandwidth_aware_router_beats_static_threshold_during_dip() -> None:
    static = _dip_run("threshold")
    aware = _dip_run("prfaas")
    link = "prfaas->pd"
    assert aware["requests"]["completed"] == static["requests"]["completed"] > 500
    assert aware["links"][link]["peak_backlog_bytes"] < static["links"][link]["peak_backlog_bytes"]
    assert aware["ttft_s"]["p99"] < static["ttft_s"]["p99"]
    # It did so by its own mechanisms: t was re-searched and/or requests were kept local.
    assert aware["threshold_updates"] or aware["requests"]["rerouted"] > 0


@pytest.mark.timeout(120)
def test_rebalancer_reaches_the_analytic_split() -> None:
    lam = plan().prfaas.lambda_max_exact
    base = paper_deployment("paper-prfaas", rate_rps=0.95 * lam, n_p=6, n_d=2)
    base = replace(base, duration_s=600.0, drain_s=0.0, warmup_s=0.0)

    def run(rebalance: bool) -> tuple[Simulator, dict]:  # type: ignore[type-arg]
        sim = Simulator(replace(base, rebalance=rebalance))
        sim.run(until_s=600.0)
        return sim, summary(sim)

    _, fixed = run(False)
    sim, moved = run(True)
    roles = [n.role for n in sim.nodes if n.site == 0]
    assert roles.count(NodeRole.PREFILL) == 3
    assert roles.count(NodeRole.DECODE) == 5
    assert moved["role_changes"] and len(moved["role_changes"]) == 3
    assert moved["requests"]["completed"] > 1.2 * fixed["requests"]["completed"]
