"""Simulation predicts reality: one small saturated scenario run live (emulated ``timed``
nodes, real processes and sockets) and in the simulator with the same requests and seed: every
request takes the same route in both, and both complete every request. (How close throughput and
TTFT come is a measured figure, printed by `prfaas demo`, not asserted here.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from prfaas.commands.demo import route_agreement
from prfaas.serve import demo

pytestmark = pytest.mark.timeout(240)


def test_live_and_simulated_runs_route_and_complete_the_same_requests(tmp_path: Path) -> None:
    # 4 req/s is beyond the PrfaaS-PD deployment's ~3.2 req/s capacity: queues form in both.
    settings = demo.DemoSettings(num_requests=24, rate_rps=4.0, output_tokens=256, seed=3)
    specs = demo.workload(settings)
    deployment = demo.deployments(settings.link_gbps)[0]
    live = demo.run_live(deployment, settings, specs, tmp_path)
    sim = demo.run_sim(deployment, settings, specs)
    assert live["completed"] == sim["completed"] == len(specs)
    assert live["failed"] == sim["failed"] == 0
    assert None not in live["offloaded_by_request"]
    assert live["offloaded_by_request"] == sim["offloaded_by_request"]
    assert 0 < live["offloaded"] < len(specs)  # both routes are exercised
    agreement = route_agreement(live, sim)
    print(f"live vs sim: {agreement}")
