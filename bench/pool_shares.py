"""The pool's fair share, simulated (issue 21, Must hold (a)-(c)); prints each figure.

(a) two tenants, same mix and links, weights 2:1, both offering more than the pool serves:
    compute and egress share ratios (promise: 2:1 within 10%).
(b) tenant A compute-heavy (2k-token prompts), B byte-heavy (32k-token prompts) on a dense model,
    equal weights: the rule's promise, computed before the run from the cost model (equal
    dominant shares x; A's compute share = B's egress share = x; the binding resource full).
(c) A stops at 100 s: B's share of the pool before and after A's queue drained.
(d) examples/pool: the front door dies at 200 s for 0.4 s or 5 s (queue lost, new epoch), or two
    pool nodes are lost mid-prefill: every request completes; fallbacks by reason and the
    fallen-back requests' TTFT.
Same scenarios as tests/unit/sim/test_pool_sim.py.

    PYTHONPATH=src .venv/bin/python bench/pool_shares.py
"""

from __future__ import annotations

from typing import Any

from prfaas.perf import cost_model_for
from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.sim.pool_report import pool_summary
from prfaas.sim.pool_scenario import PoolSimGroup, PoolSimScenario, PoolSimTenant
from prfaas.sim.pool_sim import PoolSimulator
from prfaas.workload import ArrivalSpec, FixedLengths, TruncatedLogNormal


def _run(sc: PoolSimScenario) -> dict[str, Any]:
    sim = PoolSimulator(sc)
    sim.run()
    return pool_summary(sim)


def two_to_one(stop_a_s: float | None, lo: float, hi: float, dur: float) -> dict[str, Any]:
    h200, h20 = cost_model_for("paper-1t", "h200"), cost_model_for("paper-1t", "h20")
    shape = PoolShape(
        (GroupShape("g", "paper-1t", 4),),
        100e9 / 8,
        (
            TenantShare("a", 2.0, max_queued_tokens=2_000_000),
            TenantShare("b", 1.0, max_queued_tokens=2_000_000),
        ),
    )

    def tenant(name: str, seed: int, stop: float | None) -> PoolSimTenant:
        return PoolSimTenant(name, "paper-1t", ArrivalSpec("poisson", 3.0), TruncatedLogNormal(),
                             8, h20, 50e9 / 8, rtt_s=0.01, threshold_tokens=0, tuner="fixed",
                             seed=seed, stop_s=stop)  # fmt: skip

    groups = (PoolSimGroup("g", "paper-1t", 4, h200),)
    tenants = (tenant("a", 1, stop_a_s), tenant("b", 2, None))
    return _run(PoolSimScenario(shape, groups, tenants, duration_s=dur, measure_from_s=lo,
                                measure_to_s=hi))  # fmt: skip


def compute_vs_bytes() -> tuple[dict[str, float], dict[str, Any]]:
    model, n, short, long_ = "llama-3.1-70b", 4, 2048, 32768
    pool_cost, local_cost = cost_model_for(model, "h200"), cost_model_for(model, "h20")
    a_bps = pool_cost.kv_bytes(short) / pool_cost.prefill_s(short)
    b_bps = pool_cost.kv_bytes(long_) / pool_cost.prefill_s(long_)
    egress = n * (a_bps + b_bps) / 2
    kb, ka = egress / (n * b_bps), n * a_bps / egress
    x = min(1 / (1 + kb), 1 / (1 + ka))
    predicted = {"a_compute": x, "a_egress": x * ka, "b_compute": x * kb, "b_egress": x}
    shape = PoolShape(
        (GroupShape("g", model, n),),
        egress,
        (TenantShare("a", max_queued_tokens=400_000), TenantShare("b", max_queued_tokens=400_000)),
    )

    def tenant(name: str, seed: int, tokens: int, rate: float) -> PoolSimTenant:
        return PoolSimTenant(name, model, ArrivalSpec("poisson", rate), FixedLengths(tokens), 16,
                             local_cost, 100e9 / 8, rtt_s=0.01, threshold_tokens=0, tuner="fixed",
                             seed=seed)  # fmt: skip

    sc = PoolSimScenario(shape, (PoolSimGroup("g", model, n, pool_cost),),
                         (tenant("a", 1, short, 10.0), tenant("b", 2, long_, 1.5)),
                         duration_s=240, drain_s=1200, measure_from_s=30)  # fmt: skip
    return predicted, _run(sc)


def main() -> None:
    out = two_to_one(None, 30.0, 240.0, 240.0)
    a, b = out["tenants"]["a"], out["tenants"]["b"]
    print(f"(a) 2:1, both overloaded: compute {a['compute_share']['g']:.3f} : "
          f"{b['compute_share']['g']:.3f} = {a['compute_share']['g'] / b['compute_share']['g']:.3f}"
          f"; egress {a['egress_share']:.4f} : {b['egress_share']:.4f} = "
          f"{a['egress_share'] / b['egress_share']:.3f}; pool busy "
          f"{out['pool']['groups']['g']['utilisation']:.3f}")  # fmt: skip
    predicted, out = compute_vs_bytes()
    a, b = out["tenants"]["a"], out["tenants"]["b"]
    print(
        "(b) promise (before the run): " + ", ".join(f"{k} {v:.3f}" for k, v in predicted.items())
    )
    print(f"    measured: a_compute {a['compute_share']['g']:.3f}, a_egress "
          f"{a['egress_share']:.3f}, b_compute {b['compute_share']['g']:.3f}, b_egress "
          f"{b['egress_share']:.3f}; dominant a {a['dominant_share']:.3f} b "
          f"{b['dominant_share']:.3f}")  # fmt: skip
    before = two_to_one(100.0, 30.0, 100.0, 300.0)["tenants"]["b"]
    after = two_to_one(100.0, 200.0, 300.0, 300.0)["tenants"]
    print(f"(c) A stops at 100 s: B's compute share {before['compute_share']['g']:.3f} "
          f"(30-100 s) -> {after['b']['compute_share']['g']:.3f} (200-300 s; A "
          f"{after['a']['compute_share']['g']:.3f}); egress {before['egress_share']:.4f} -> "
          f"{after['b']['egress_share']:.4f}")  # fmt: skip
    outages()


def outages() -> None:
    from dataclasses import replace
    from pathlib import Path

    from prfaas.commands.sim_pool import build_pool_scenario

    root = Path(__file__).resolve().parent.parent / "examples" / "pool"
    files = [root / "tenant-a.yaml", root / "tenant-b.yaml"]
    base = build_pool_scenario(root / "pool.yaml", files)
    cases = [(f"front door down {d} s at 200 s", replace(base, front_door_outages=((200.0, d),)))
             for d in (0.4, 5.0)]  # fmt: skip
    nodes = tuple((200.0 + i, "g-1t", 30.0) for i in range(2))
    cases.append(("2 of 4 g-1t nodes lost at 200-201 s for 30 s",
                  replace(base, pool_node_failures=nodes)))  # fmt: skip
    for what, sc in cases:
        out = _run(sc)
        for name, t in out["tenants"].items():
            r, fb = t["requests"], t["fallback_ttft_s"]
            print(f"(d) {what}: {name}: {r['completed']}/"
                  f"{r['arrived']} completed, fallbacks {r['fallbacks']}, their TTFT mean "
                  f"{fb['mean']:.2f} max {fb['max']:.2f} s (all requests: mean "
                  f"{t['ttft_s']['mean']:.2f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
