"""Regenerate the numbers of docs/simulation.md's results page (each row is one `prfaas sim` run).

    .venv/bin/python bench/sim_results.py [--only SECTION] [--quick]

Prints markdown tables with the exact command of every row. Sections: maxrate, arrivals,
mooncake, dip, rebalance, sweep, multisite. About 5 minutes of CPU in all (--quick: fewer
requests per max-rate trial, less precise).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

from prfaas.cli import main as cli

TRACE = str(
    Path(__file__).resolve().parent.parent.parent
    / "shared/traces/mooncake_conversation_trace.jsonl"
)
DEPS = ("paper-prfaas", "paper-homogeneous", "paper-naive")


def sim(*argv: str) -> tuple[str, dict[str, Any]]:
    args = ["sim", *argv, "--json"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli(args)
    if rc != 0:
        raise SystemExit(f"prfaas {' '.join(args)} exited {rc}")
    return "prfaas " + " ".join(args), json.loads(buf.getvalue())


def row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


def f(x: float, n: int = 2) -> str:
    return f"{x:.{n}f}"


def maxrate(quick: bool) -> None:
    from prfaas.sim.scenario import paper_plan

    n = "6000" if quick else "20000"
    res = paper_plan()
    print("\n### Simulated max rate vs the analytic capacity\n")
    row("deployment", "paper Lambda_max (T of mean)", "lambda_max_exact", "simulated max_rate_rps",
        "sim / exact", "command")  # fmt: skip
    row(*["---"] * 6)
    for d in DEPS:
        cmd, out = sim("--deployment", d, "--find-max-rate", "--max-rate-requests", n)
        plan = {"paper-prfaas": res.prfaas, "paper-homogeneous": res.homogeneous,
                "paper-naive": res.naive}[d]  # fmt: skip
        row(d, f(plan.lambda_max, 3), f(plan.lambda_max_exact, 3), f(out["max_rate_rps"], 3),
            f(out["ratio_to_exact"], 4), f"`{cmd}`")  # fmt: skip


def arrivals() -> None:
    print(
        "\n### TTFT at 80% of each deployment's lambda_max_exact (1 h, first 5 min not counted)\n"
    )
    row("deployment", "arrivals", "rate (req/s)", "TTFT p50 / p90 / p99 (s)", "mean TTFT (s)",
        "command")  # fmt: skip
    row(*["---"] * 6)
    for d in DEPS:
        for arr in (["uniform"], ["poisson"], ["gamma", "--cv", "3"], ["onoff"]):
            cmd, out = sim("--deployment", d, "--arrival", *arr, "--duration", "3600",
                           "--warmup", "300")  # fmt: skip
            t = out["ttft_s"]
            rate = out["scenario"]["arrival"]["rate_rps"]
            row(d, " ".join(arr).replace("--", ""), f(rate), f"{f(t['p50'])} / {f(t['p90'])} / "
                f"{f(t['p99'])}", f(t["mean"]), f"`{cmd}`")  # fmt: skip


def mooncake() -> None:
    print("\n### Mooncake conversation trace (12,031 requests, 1 h) with prefix caching\n")
    row("deployment / router", "rate scale", "throughput (req/s)", "TTFT mean / p99 (s)",
        "hit rate PD / PrfaaS", "GB across sites", "offloaded", "command")  # fmt: skip
    row(*["---"] * 8)
    cases = [("paper-prfaas", "threshold"), ("paper-prfaas", "prfaas"),
             ("paper-homogeneous", "local_only"), ("paper-naive", "naive")]  # fmt: skip
    for scale in ("1", "2"):
        for d, pol in cases:
            cmd, out = sim("--deployment", d, "--policy", pol, "--trace", TRACE, "--rate-scale",
                           scale, "--duration", "100000")  # fmt: skip
            sites = out["sites"]
            hit_pd = sites["pd"]["prefix_hit_rate"]
            hit_rf = sites.get("prfaas", {}).get("prefix_hit_rate", 0.0)
            moved = sum(v["bytes_moved"] for v in out["links"].values()) / 1e9
            span = out["simulated_s"]
            thr = out["requests"]["completed"] / span if span else 0.0
            t = out["ttft_s"]
            row(f"{d} / {pol}", scale, f(thr), f"{f(t['mean'])} / {f(t['p99'])}",
                f"{f(hit_pd, 3)} / {f(hit_rf, 3)}", f(moved, 1), out["requests"]["offloaded"],
                f"`{cmd}`")  # fmt: skip


def dip() -> None:
    print("\n### Link dip: 100 -> X Gbps from t=60 s to t=120 s, Poisson arrivals, 4 min\n")
    row("dip to", "load", "router", "TTFT mean / p99 (s)", "peak backlog (GB)", "rerouted",
        "t updates", "command")  # fmt: skip
    row(*["---"] * 8)
    from prfaas.sim.scenario import paper_plan

    lam = paper_plan().prfaas.lambda_max_exact
    for gbps in ("10", "5"):
        for load in (0.8, 0.9):
            for pol, extra in (("threshold", []), ("prfaas", ["--no-tune"]), ("prfaas", [])):
                cmd, out = sim("--policy", pol, *extra, "--arrival", "poisson", "--rate",
                               f"{load * lam:.4f}", "--duration", "240", "--seed", "1",
                               "--link-schedule", f"60:{gbps},120:100")  # fmt: skip
                t = out["ttft_s"]
                name = pol + (" (no re-search of t)" if extra else "")
                backlog = out["links"]["prfaas->pd"]["peak_backlog_bytes"] / 1e9
                moved = out["requests"]["rerouted"]
                n_upd = len(out["threshold_updates"])
                ttft = f"{f(t['mean'])} / {f(t['p99'])}"
                row(gbps, load, name, ttft, f(backlog, 1), moved, n_upd, f"`{cmd}`")


def rebalance() -> None:
    print("\n### Rebalancing (30 min, uniform arrivals)\n")
    row("start split", "workload", "router", "rebalancer", "final split", "completed",
        "TTFT p99 (s)", "command")  # fmt: skip
    row(*["---"] * 8)
    cases = [
        (6, 2, "9.9", "3.0", "threshold"),
        (3, 5, "9.9", "3.0", "threshold"),
        (3, 5, "10.4", "2.4", "prfaas"),
        (3, 5, "9.0", "3.8", "prfaas"),
    ]
    for np_, nd, mu, rate, pol in cases:
        for reb in ([], ["--rebalance"]):
            cmd, out = sim("--n-p", str(np_), "--n-d", str(nd), "--mu", mu, "--rate", rate,
                           "--policy", pol, "--duration", "1800", *reb)  # fmt: skip
            s = out["sites"]["pd"]
            row(f"{np_}/{nd}", f"mu {mu}, {rate} req/s", pol, bool(reb),
                f"{s['num_prefill_nodes']}/{s['num_decode_nodes']}", out["requests"]["completed"],
                f(out["ttft_s"]["p99"]), f"`{cmd}`")  # fmt: skip


def rtt() -> None:
    print("\n### RTT and TCP windows: TTFT at 80% load (10 min, Poisson)\n")
    row("RTT (ms)", "TCP", "per-transfer cap (Gbps)", "TTFT mean / p99 (s)", "command")
    row(*["---"] * 5)
    for ms in ("1", "10", "25", "50"):
        for conns, win in (("8", "16"), ("1", "4")):
            cmd, out = sim("--rtt-ms", ms, "--connections", conns, "--window-mib", win,
                           "--arrival", "poisson", "--duration", "600", "--seed", "2")  # fmt: skip
            cap = int(conns) * float(win) * 2**20 * 8 / (float(ms) / 1000) / 1e9
            t = out["ttft_s"]
            ttft = f"{f(t['mean'])} / {f(t['p99'])}"
            row(ms, f"{conns} x {win} MiB", f(min(cap, 100.0), 1), ttft, f"`{cmd}`")


def sweep(quick: bool) -> None:
    print("\n### Where PrfaaS stops paying: link RTT and bandwidth (max rate, req/s)\n")
    print("Homogeneous PD (same 96 GPUs, no link) sustains lambda_max_exact = 2.02 req/s.\n")
    n = "4000" if quick else "8000"
    row("bandwidth (Gbps)", "RTT (ms)", "simulated max rate", "planner lambda_max_exact",
        "vs homogeneous", "command")  # fmt: skip
    row(*["---"] * 6)
    from prfaas.sim.scenario import paper_plan

    homog = paper_plan().homogeneous.lambda_max_exact
    pts = [(g, 5) for g in (5, 10, 25, 100, 400)] + [(100, r) for r in (1, 25, 50)]
    pts += [(10, 50), (25, 50)]
    for gbps, rtt in pts:
        cmd, out = sim("--link-gbps", str(gbps), "--rtt-ms", str(rtt), "--find-max-rate",
                       "--max-rate-requests", n)  # fmt: skip
        exact = paper_plan(float(gbps)).prfaas.lambda_max_exact
        row(gbps, rtt, f(out["max_rate_rps"], 3), f(exact, 3), f(out["max_rate_rps"] / homog),
            f"`{cmd}`")  # fmt: skip


def multisite(quick: bool) -> None:
    print("\n### Two PD sites (3P/5D each) sharing one PrfaaS site (4 x H200)\n")
    n = "4000" if quick else "8000"
    row("setup", "threshold t", "simulated max rate (req/s, both sites)", "command")
    row(*["---"] * 4)
    from prfaas.analytic import Scenario, plan

    shared_t = plan(Scenario(n_prfaas=2)).prfaas.threshold_tokens
    for label, extra in (
        ("one PD site (the paper)", []),
        ("two PD sites, planned t", ["--pd-sites", "2"]),
        ("two PD sites, t re-planned for 2 PrfaaS nodes per site", ["--pd-sites", "2",
                                                                     "--threshold", str(shared_t)]),
        ("two PD sites, two PrfaaS sites", ["--pd-sites", "2", "--prfaas-sites", "2"]),
    ):  # fmt: skip
        cmd, out = sim(*extra, "--rate", "3.0", "--find-max-rate", "--max-rate-requests", n)
        tval = extra[extra.index("--threshold") + 1] if "--threshold" in extra else "19628"
        row(label, tval, f(out["max_rate_rps"], 3), f"`{cmd}`")


SECTIONS = {
    "maxrate": maxrate, "arrivals": arrivals, "mooncake": mooncake, "dip": dip,
    "rebalance": rebalance, "rtt": rtt, "sweep": sweep, "multisite": multisite,
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(SECTIONS), action="append")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    for name in args.only or list(SECTIONS):
        fn: Any = SECTIONS[name]
        fn(args.quick) if name in ("maxrate", "sweep", "multisite") else fn()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
