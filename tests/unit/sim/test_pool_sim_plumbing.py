"""The pool simulator charges the profiles' plumbing terms where its processes pay them
(``sim/pool_sim.py``): one isolated request's TTFT grows by exactly the pool group's
``prefill_per_request_s`` (offloaded) or its tenant's (local), plus its tenant gateway's
``gateway_per_request_s``; each switch (``plumbing_off``, from the pool and tenant files'
``simulation.plumbing``) removes its term; the live front door prices a prefill as the simulator
runs it (``prefill_node_s``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from prfaas.perf import CostModel, cost_model_for
from prfaas.perf.plumbing import NO_PLUMBING, PlumbingCosts
from prfaas.policy.pool_admission import prefill_node_s
from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.sim.pool_scenario import PoolSimGroup, PoolSimScenario, PoolSimTenant
from prfaas.sim.pool_sim import PoolSimulator
from prfaas.workload import ArrivalSpec, FixedLengths

pytestmark = pytest.mark.timeout(60)

TOKENS = 8192
POOL_PER_REQUEST_S = 0.05
LOCAL_PER_REQUEST_S = 0.02
GATEWAY_PER_REQUEST_S = 0.003
POOL_COST = replace(
    cost_model_for("paper-1t", "h200"),
    plumbing=PlumbingCosts(prefill_per_request_s=POOL_PER_REQUEST_S, decode_per_request_s=0.7,
                           decode_per_kv_byte_s=1e-6, decode_per_step_s=0.1),
)  # fmt: skip
"""Decode terms too (large): the pool simulator models no decode and must not charge them."""
LOCAL_COST = replace(
    cost_model_for("paper-1t", "h20"),
    plumbing=PlumbingCosts(prefill_per_request_s=LOCAL_PER_REQUEST_S,
                           gateway_per_request_s=GATEWAY_PER_REQUEST_S,
                           gateway_per_output_token_s=0.01, decode_per_output_token_s=0.1),
)  # fmt: skip


def _bare(cm: CostModel) -> CostModel:
    return replace(cm, plumbing=NO_PLUMBING)


def _ttft(
    *,
    offload: bool,
    pool_cost: CostModel = POOL_COST,
    local_cost: CostModel = LOCAL_COST,
    pool_off: tuple[str, ...] = (),
    tenant_off: tuple[str, ...] = (),
) -> float:
    """One request of ``TOKENS`` at t = 0, alone: offloaded (t = 0) or kept local (t huge)."""
    shape = PoolShape((GroupShape("g", "paper-1t", 1),), 100e9 / 8, (TenantShare("a"),))
    tenant = PoolSimTenant(
        "a", "paper-1t", ArrivalSpec("poisson", 1.0), FixedLengths(TOKENS), 1, local_cost,
        100e9 / 8, rtt_s=0.01, threshold_tokens=0 if offload else 10**9, tuner="fixed",
        trace=((0.0, TOKENS),), plumbing_off=tenant_off,
    )  # fmt: skip
    group = PoolSimGroup("g", "paper-1t", 1, pool_cost, plumbing_off=pool_off)
    sim = PoolSimulator(PoolSimScenario(shape, (group,), (tenant,), duration_s=10.0))
    sim.run()
    run = sim.tenants["a"]
    assert run.num_completed == 1 and run.num_offloaded == (1 if offload else 0)
    return run.ttft_s[0]


@pytest.fixture(scope="module")
def bare() -> dict[bool, float]:
    """The same request's TTFT with no plumbing measured at all, offloaded and local."""
    return {o: _ttft(offload=o, pool_cost=_bare(POOL_COST), local_cost=_bare(LOCAL_COST))
            for o in (True, False)}  # fmt: skip


def test_a_pool_request_pays_the_pool_nodes_term_and_its_gateways(bare: dict[bool, float]) -> None:
    extra = _ttft(offload=True) - bare[True]
    assert extra == pytest.approx(POOL_PER_REQUEST_S + GATEWAY_PER_REQUEST_S, abs=1e-9)


def test_a_local_request_pays_its_own_sites_term_and_its_gateways(bare: dict[bool, float]) -> None:
    extra = _ttft(offload=False) - bare[False]
    assert extra == pytest.approx(LOCAL_PER_REQUEST_S + GATEWAY_PER_REQUEST_S, abs=1e-9)


def test_each_switch_removes_its_term(bare: dict[bool, float]) -> None:
    both = POOL_PER_REQUEST_S + GATEWAY_PER_REQUEST_S
    pool_off = _ttft(offload=True, pool_off=("prefill_per_request_s",)) - bare[True]
    assert pool_off == pytest.approx(GATEWAY_PER_REQUEST_S, abs=1e-9)
    gw_off = _ttft(offload=True, tenant_off=("gateway_per_request_s",)) - bare[True]
    assert gw_off == pytest.approx(POOL_PER_REQUEST_S, abs=1e-9)
    # The tenant's prefill switch is its own nodes': the pool's term stays.
    tenant_prefill_off = _ttft(offload=True, tenant_off=("prefill_per_request_s",)) - bare[True]
    assert tenant_prefill_off == pytest.approx(both, abs=1e-9)
    local_off = _ttft(offload=False, tenant_off=("prefill_per_request_s",)) - bare[False]
    assert local_off == pytest.approx(GATEWAY_PER_REQUEST_S, abs=1e-9)
    # The pool's switch is its nodes': a local prefill keeps its own.
    local_pool_off = _ttft(offload=False, pool_off=("prefill_per_request_s",)) - bare[False]
    assert local_pool_off == pytest.approx(LOCAL_PER_REQUEST_S + GATEWAY_PER_REQUEST_S, abs=1e-9)


def test_the_price_is_the_node_time_the_live_door_charges() -> None:
    # The live front door prices with prefill_node_s (pool/service.py); so does the simulator.
    assert prefill_node_s(POOL_COST, TOKENS) == pytest.approx(
        POOL_COST.prefill_s(TOKENS) + POOL_PER_REQUEST_S
    )
    assert prefill_node_s(POOL_COST, 4096, 4096) == pytest.approx(
        POOL_COST.prefill_s(4096, 4096) + POOL_PER_REQUEST_S
    )


def test_an_unknown_term_is_refused() -> None:
    with pytest.raises(ValueError, match="group g: unknown plumbing term 'prefill_s'"):
        PoolSimGroup("g", "paper-1t", 1, POOL_COST, plumbing_off=("prefill_s",))


def test_the_files_switches_reach_the_scenario(tmp_path: Path) -> None:
    from prfaas.commands.sim_pool import build_pool_scenario

    examples = Path(__file__).resolve().parents[3] / "examples" / "pool"
    pool = yaml.safe_load((examples / "pool.yaml").read_text())
    sc = build_pool_scenario(examples / "pool.yaml", [examples / "tenant-a.yaml"])
    assert all(g.plumbing_off == () for g in sc.groups)  # no section: all on
    assert sc.tenants[0].plumbing_off == ()
    pool["simulation"] = {"plumbing": {"prefill_per_request": False}}
    tenant = yaml.safe_load((examples / "tenant-a.yaml").read_text())
    tenant.setdefault("simulation", {})["plumbing"] = {"gateway_per_request": False}
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    (tmp_path / "tenant-a.yaml").write_text(yaml.safe_dump(tenant))
    sc = build_pool_scenario(tmp_path / "pool.yaml", [tmp_path / "tenant-a.yaml"])
    assert all(g.plumbing_off == ("prefill_per_request_s",) for g in sc.groups)
    assert sc.tenants[0].plumbing_off == ("gateway_per_request_s",)
