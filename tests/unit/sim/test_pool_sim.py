"""The pool simulator's Must-hold checks (issue 21), simulated: (a) weights 2:1, both tenants
offering more than the pool serves -> compute and egress shares within 10% of 2:1; (b) a
compute-heavy and a byte-heavy tenant -> the documented rule's promise (equal dominant shares,
the predicted shares computed before the run) within 10%; (c) one tenant stops -> the other's
share rises to the whole pool; every request completes (offloaded or local)."""

from __future__ import annotations

import pytest

from prfaas.perf import cost_model_for
from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.sim.pool_report import pool_summary
from prfaas.sim.pool_scenario import PoolSimGroup, PoolSimScenario, PoolSimTenant
from prfaas.sim.pool_sim import PoolSimulator
from prfaas.workload import ArrivalSpec, FixedLengths, TruncatedLogNormal

pytestmark = pytest.mark.timeout(120)

H200 = cost_model_for("paper-1t", "h200")
H20 = cost_model_for("paper-1t", "h20")


def _tenant(name: str, seed: int, rate: float, stop_s: float | None = None) -> PoolSimTenant:
    return PoolSimTenant(
        name,
        "paper-1t",
        ArrivalSpec("poisson", rate),
        TruncatedLogNormal(),
        8,
        H20,
        50e9 / 8,
        rtt_s=0.01,
        threshold_tokens=0,
        tuner="fixed",
        seed=seed,
        stop_s=stop_s,
    )


def _two_to_one(
    stop_a_s: float | None, measure: tuple[float, float], duration_s: float = 240.0
) -> dict:
    shape = PoolShape(
        (GroupShape("g", "paper-1t", 4),),
        100e9 / 8,
        (
            TenantShare("a", 2.0, max_queued_tokens=2_000_000),
            TenantShare("b", 1.0, max_queued_tokens=2_000_000),
        ),
    )
    sc = PoolSimScenario(
        shape,
        (PoolSimGroup("g", "paper-1t", 4, H200),),
        (_tenant("a", 1, 3.0, stop_a_s), _tenant("b", 2, 3.0)),
        duration_s=duration_s,
        measure_from_s=measure[0],
        measure_to_s=measure[1],
    )
    sim = PoolSimulator(sc)
    sim.run()
    return pool_summary(sim)


def _all_complete(out: dict) -> None:
    for t in out["tenants"].values():
        assert t["requests"]["arrived"] > 0
        assert t["requests"]["completed"] == t["requests"]["arrived"]


def test_weights_two_to_one_both_overloaded() -> None:
    out = _two_to_one(None, (30.0, 240.0))
    a, b = out["tenants"]["a"], out["tenants"]["b"]
    assert out["pool"]["groups"]["g"]["utilisation"] > 0.95  # both offer more than it serves
    assert a["compute_share"]["g"] / b["compute_share"]["g"] == pytest.approx(2.0, rel=0.10)
    assert a["egress_share"] / b["egress_share"] == pytest.approx(2.0, rel=0.10)
    _all_complete(out)


def test_a_stopping_gives_b_the_whole_pool() -> None:
    before = _two_to_one(100.0, (30.0, 100.0), duration_s=300.0)["tenants"]["b"]
    assert before["compute_share"]["g"] == pytest.approx(1 / 3, rel=0.10)
    # a's queue (its cap: 2M tokens) drains after it stops; then b has the whole pool.
    out = _two_to_one(100.0, (200.0, 300.0), duration_s=300.0)
    a, b = out["tenants"]["a"], out["tenants"]["b"]
    assert a["compute_share"]["g"] == 0.0
    assert b["compute_share"]["g"] > 0.95
    assert b["egress_share"] > 2.5 * before["egress_share"]
    _all_complete(out)


def test_compute_heavy_and_byte_heavy_get_equal_dominant_shares() -> None:
    model = "llama-3.1-70b"  # dense: its KV per compute-second grows with length
    pool_cost, local_cost = cost_model_for(model, "h200"), cost_model_for(model, "h20")
    short, long_ = 2048, 32768
    n = 4
    # Bytes per node-second: a (short prompts) is compute-heavy, b (long) byte-heavy.
    a_bps = pool_cost.kv_bytes(short) / pool_cost.prefill_s(short)
    b_bps = pool_cost.kv_bytes(long_) / pool_cost.prefill_s(long_)
    egress = n * (a_bps + b_bps) / 2
    # The promise, stated before the run: equal weights, both backlogged -> equal dominant
    # shares x; a's dominant resource is compute (c_a = x), b's the egress (e_b = x, so
    # c_b = x * egress / (n * b_bps)); the binding resource is saturated.
    kb = egress / (n * b_bps)  # b's compute share per unit of egress share
    ka = n * a_bps / egress  # a's egress share per unit of compute share
    x = min(1 / (1 + kb), 1 / (1 + ka))
    predicted = {"a_compute": x, "b_egress": x, "b_compute": x * kb, "a_egress": x * ka}
    shape = PoolShape(
        (GroupShape("g", model, n),),
        egress,
        (TenantShare("a", max_queued_tokens=400_000), TenantShare("b", max_queued_tokens=400_000)),
    )

    def tenant(name: str, seed: int, tokens: int, rate: float) -> PoolSimTenant:
        return PoolSimTenant(
            name,
            model,
            ArrivalSpec("poisson", rate),
            FixedLengths(tokens),
            16,
            local_cost,
            100e9 / 8,
            rtt_s=0.01,
            threshold_tokens=0,
            tuner="fixed",
            seed=seed,
        )

    sc = PoolSimScenario(
        shape,
        (PoolSimGroup("g", model, n, pool_cost),),
        (tenant("a", 1, short, 10.0), tenant("b", 2, long_, 1.5)),
        duration_s=240,
        drain_s=1200,
        measure_from_s=30,
    )
    sim = PoolSimulator(sc)
    sim.run()
    out = pool_summary(sim)
    a, b = out["tenants"]["a"], out["tenants"]["b"]
    assert a["compute_share"]["g"] == pytest.approx(predicted["a_compute"], rel=0.10)
    assert b["egress_share"] == pytest.approx(predicted["b_egress"], rel=0.10)
    assert b["compute_share"]["g"] == pytest.approx(predicted["b_compute"], rel=0.10)
    assert a["egress_share"] == pytest.approx(predicted["a_egress"], rel=0.10)
    assert a["dominant_share"] / b["dominant_share"] == pytest.approx(1.0, rel=0.10)
    _all_complete(out)


def test_same_seed_same_json() -> None:
    assert _two_to_one(None, (0.0, 60.0)) == _two_to_one(None, (0.0, 60.0))


def test_coordinated_tuners_beat_uncoordinated_on_the_example() -> None:
    from pathlib import Path

    from prfaas.commands.sim_pool import build_pool_scenario

    root = Path(__file__).resolve().parents[3] / "examples" / "pool"
    files = [root / "tenant-a.yaml", root / "tenant-b.yaml"]
    means = {}
    for tuner in ("coordinated", "uncoordinated"):
        sc = build_pool_scenario(root / "pool.yaml", files, tuner=tuner, duration_s=300.0)
        sim = PoolSimulator(sc)
        sim.run()
        out = pool_summary(sim)
        _all_complete(out)
        means[tuner] = {n: t["ttft_s"]["mean"] for n, t in out["tenants"].items()}
        offloads = {n: t["requests"]["offloaded"] for n, t in out["tenants"].items()}
        assert all(v > 0 for v in offloads.values())
    # Each uncoordinated tenant plans as if it owned the 4 nodes: the pool's queue grows.
    for name in ("tenant-a", "tenant-b"):
        assert means["coordinated"][name] < means["uncoordinated"][name]


@pytest.mark.parametrize(("down_s", "reason"), [(0.4, "epoch_changed"), (5.0, "pool_silent")])
def test_front_door_outage_loses_nothing(down_s: float, reason: str) -> None:
    from dataclasses import replace

    shape = PoolShape(
        (GroupShape("g", "paper-1t", 4),),
        100e9 / 8,
        (TenantShare("a", 2.0, max_queued_tokens=2_000_000), TenantShare("b", 1.0)),
    )
    tenants = (_tenant("a", 1, 3.0), _tenant("b", 2, 1.0))
    sc = PoolSimScenario(shape, (PoolSimGroup("g", "paper-1t", 4, H200),), tenants,
                         duration_s=120, front_door_outages=((60.0, down_s),))  # fmt: skip
    sim = PoolSimulator(sc)
    sim.run()
    out = pool_summary(sim)
    _all_complete(out)
    fallbacks = {n: t["requests"]["fallbacks"] for n, t in out["tenants"].items()}
    assert fallbacks["a"].get(reason, 0) > 0  # a had a queue at the pool when it died
    quiet = pool_summary(_run_quiet(replace(sc, front_door_outages=())))
    for t in quiet["tenants"].values():  # refusals over a cap remain; nothing else falls back
        assert all(r.startswith("refused:") for r in t["requests"]["fallbacks"])


def _run_quiet(sc: PoolSimScenario) -> PoolSimulator:
    sim = PoolSimulator(sc)
    sim.run()
    return sim


def test_a_lost_pool_node_fails_its_prefill_to_local() -> None:
    shape = PoolShape(
        (GroupShape("g", "paper-1t", 4),),
        100e9 / 8,
        (TenantShare("a", 2.0, max_queued_tokens=2_000_000), TenantShare("b", 1.0)),
    )
    tenants = (_tenant("a", 1, 3.0), _tenant("b", 2, 1.0))
    failures = ((50.0, "g", 30.0), (51.0, "g", 30.0))
    sc = PoolSimScenario(shape, (PoolSimGroup("g", "paper-1t", 4, H200),), tenants,
                         duration_s=120, pool_node_failures=failures)  # fmt: skip
    sim = PoolSimulator(sc)
    sim.run()
    out = pool_summary(sim)
    _all_complete(out)
    lost = sum(
        t["requests"]["fallbacks"].get("failed:node_lost", 0) for t in out["tenants"].values()
    )
    assert lost == 2  # the pool was busy: each lost node was running a prefill
    assert all(len(sim._free[g]) == 4 for g in sim._free)  # both nodes came back
