"""Simulator speed: requests simulated per CPU-second (process time), median of several runs.

Cases: the paper's case study (PrfaaS-PD) at saturation (uniform arrivals at the planner's
lambda_max_exact), the Mooncake conversation trace with prefix caching, and (``--large``) a
10,000-GPU deployment (1,250 instances: 104 copies of the paper's PD site sharing one PrfaaS site
of 417 H200 instances, each PD site with its own 100 Gbps link) for one simulated hour.

    .venv/bin/python bench/sim_speed.py [--runs 3] [--large] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from prfaas.analytic import plan
from prfaas.sim import LinkConfig, Simulator, SiteConfig, paper_deployment

TRACE = (
    Path(__file__).resolve().parent.parent.parent
    / "shared/traces/mooncake_conversation_trace.jsonl"
)


def _time(sc: Any) -> tuple[float, int, int]:
    t0 = time.process_time()
    sim = Simulator(sc)
    m = sim.run()
    return time.process_time() - t0, m.num_arrived, sim.num_events


def paper_case(lam: float, duration_s: float) -> Any:
    return replace(paper_deployment("paper-prfaas", rate_rps=lam), duration_s=duration_s)


def mooncake_case() -> Any:
    sc = paper_deployment("paper-prfaas")
    return replace(sc, trace=str(TRACE), prefix_cache=True, duration_s=4000.0)


def large_case(lam: float) -> Any:
    copies = 104
    sites = [SiteConfig(f"pd{i}", "pd", "h20", 3, 5) for i in range(copies)]
    sites.append(SiteConfig("prfaas", "prfaas", "h200", 1250 - 8 * copies))
    links = tuple(LinkConfig("prfaas", f"pd{i}", 100.0, 0.005) for i in range(copies))
    sc = paper_deployment("paper-prfaas")
    rate = 0.9 * lam * copies
    return replace(sc, sites=tuple(sites), links=links, duration_s=3600.0, drain_s=600.0,
                   arrival=replace(sc.arrival, rate_rps=rate))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--duration", type=float, default=3000.0, help="paper case: seconds of arrivals"
    )
    ap.add_argument("--large", action="store_true", help="also the 1,250-instance hour")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    lam = plan().prfaas.lambda_max_exact
    cases = {"paper_saturation": paper_case(lam, args.duration)}
    if TRACE.is_file():
        cases["mooncake_trace"] = mooncake_case()
    out: dict[str, Any] = {}
    for name, sc in cases.items():
        runs = [_time(sc) for _ in range(args.runs)]
        cpu = statistics.median(r[0] for r in runs)
        out[name] = {
            "requests": runs[0][1],
            "events": runs[0][2],
            "cpu_s": round(cpu, 3),
            "requests_per_cpu_s": round(runs[0][1] / cpu),
        }
    if args.large:
        cpu, n, events = _time(large_case(lam))
        out["large_1250_instances_1h"] = {
            "requests": n, "events": events, "cpu_s": round(cpu, 1),
            "requests_per_cpu_s": round(n / cpu),
        }  # fmt: skip
    out["requests_per_cpu_s"] = min(v["requests_per_cpu_s"] for v in out.values())
    if args.json:
        print(json.dumps(out))
    else:
        for name, v in out.items():
            print(f"{name}: {v}")


if __name__ == "__main__":
    main()
