"""Coordinated vs uncoordinated threshold tuners on a shared pool (issue 21, item 5), simulated.

Runs ``examples/pool/pool.yaml`` with ``tenant-a.yaml`` and ``tenant-b.yaml`` at their own rates,
TTFT targets of 2 s and 4 s, tenant B's rate swept 0.5x-2x, each tenant's tuner either
*coordinated* (its threshold from the pool's feedback: attainable share, expected queueing) or
*uncoordinated* (today's: as if it owned the pool). Prints a markdown table: mean TTFT per tenant
and whether both meet the target (mean TTFT <= target). ``--json`` prints the rows.

    PYTHONPATH=src .venv/bin/python bench/pool_coordination.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from prfaas.commands.sim_pool import build_pool_scenario
from prfaas.sim.pool_report import pool_summary
from prfaas.sim.pool_sim import PoolSimulator

ROOT = Path(__file__).resolve().parent.parent / "examples" / "pool"


def run(tuner: str, target_s: float, factor: float, duration_s: float | None) -> dict:
    sc = build_pool_scenario(
        ROOT / "pool.yaml",
        [ROOT / "tenant-a.yaml", ROOT / "tenant-b.yaml"],
        tuner=tuner,  # type: ignore[arg-type]
        rate_factors={"tenant-b": factor},
        ttft_target_s=target_s,
        duration_s=duration_s,
    )
    sim = PoolSimulator(sc)
    sim.run()
    out = pool_summary(sim)
    row: dict = {"tuner": tuner, "target_s": target_s, "b_rate_factor": factor}
    for name, t in out["tenants"].items():
        row[name] = {
            "mean_ttft_s": t["ttft_s"]["mean"],
            "p90_ttft_s": t["ttft_s"]["p90"],
            "offloaded": t["requests"]["offloaded"],
            "arrived": t["requests"]["arrived"],
            "compute_share": t["compute_share"]["g-1t"],
            "met": t["met_target"],
        }
    row["both_met"] = all(row[n]["met"] for n in out["tenants"])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=None, help="s of arrivals [files: 600]")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [
        run(tuner, target, factor, args.duration)
        for target in (2.0, 4.0)
        for factor in (0.5, 0.75, 1.0, 1.5, 2.0)
        for tuner in ("coordinated", "uncoordinated")
    ]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        "| TTFT target | B rate | tuner | A mean / p90 TTFT (s) | B mean / p90 TTFT (s) | "
        "A, B offloaded | both meet |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        a, b = r["tenant-a"], r["tenant-b"]
        print(
            f"| {r['target_s']:.0f} s | {r['b_rate_factor']}x | {r['tuner']} | "
            f"{a['mean_ttft_s']:.2f} / {a['p90_ttft_s']:.2f} | "
            f"{b['mean_ttft_s']:.2f} / {b['p90_ttft_s']:.2f} | "
            f"{a['offloaded']}/{a['arrived']}, {b['offloaded']}/{b['arrived']} | "
            f"{'yes' if r['both_met'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
