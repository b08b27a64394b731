"""The elastic scenario of a deployment file (``commands.sim_elastic.elastic_scenario``, what
``prfaas sim FILE`` runs) and the same scenario restated for a live emulated run's wall clock
(``sim.elastic.in_modelled_seconds``): durations divided by ``time_scale``, rates multiplied."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_sim_elastic_cli import BASE

from prfaas.commands.sim_elastic import elastic_scenario
from prfaas.config import DeploymentConfig
from prfaas.sim.elastic import in_modelled_seconds

pytestmark = pytest.mark.timeout(30)


def _file(**autoscale: Any) -> DeploymentConfig:
    doc = json.loads(json.dumps(BASE))
    doc["autoscale"].update(autoscale)
    return DeploymentConfig.model_validate(doc)


def test_the_sites_own_nodes_start_in_the_first_on_demand_group() -> None:
    sc = elastic_scenario(_file(tick_s=0.5), "f.yaml")
    spot, on_demand = sc.groups
    assert (spot.name, spot.initial_nodes) == ("spot", 0)
    assert (on_demand.name, on_demand.initial_nodes) == ("on-demand", 1)  # remote's one node
    assert sc.tick_s == 0.5 and sc.num_local_prefill == 4 and sc.threshold_tokens == 8192


def test_wall_seconds_become_modelled_seconds() -> None:
    sc = elastic_scenario(
        _file(tick_s=0.5, rate_window_s=2, up_cooldown_s=1, ttft_target_s=2, season_s=1000),
        "f.yaml",
    )
    assert in_modelled_seconds(sc, 1.0) == sc
    m = in_modelled_seconds(sc, 0.05)
    assert (m.tick_s, m.rate_window_s, m.ttft_slo_s) == pytest.approx((10.0, 40.0, 40.0))
    assert [g.startup_s for g in m.groups] == pytest.approx([1200.0, 1200.0])  # 60 s wall
    assert m.groups[0].notice_s == pytest.approx(600.0)
    assert m.groups[0].preemption.interval_s == pytest.approx(2400.0)
    auto, before = m.autoscale, sc.autoscale
    assert auto is not None and before is not None
    assert auto.up_cooldown_s == pytest.approx(20.0) and auto.season_s == pytest.approx(20_000.0)
    assert auto.prior_tokens_per_s == pytest.approx(13_000 * 0.05)  # per modelled second
    assert (auto.min_nodes, auto.max_nodes) == (before.min_nodes, before.max_nodes)
    with pytest.raises(ValueError, match="wall_s_per_modelled_s must be > 0, got 0"):
        in_modelled_seconds(sc, 0.0)
