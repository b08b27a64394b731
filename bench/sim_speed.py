"""Simulator speed: requests simulated per CPU-second (process time), median of several runs.

Cases: the paper's case study (PrfaaS-PD) at saturation (uniform arrivals at the planner's
lambda_max_exact), the Mooncake conversation trace with prefix caching, and (``--large``) a
10,000-GPU deployment (1,250 instances: 104 copies of the paper's PD site sharing one PrfaaS site
of 417 H200 instances, each PD site with its own 100 Gbps link) for one simulated hour.

    .venv/bin/python bench/sim_speed.py [--runs 3] [--large] [--json]
    .venv/bin/python bench/sim_speed.py --runs 5 --before /tmp/before/src   # side by side

``--before SRC`` measures this checkout and ``SRC`` (the ``src`` folder of another commit, e.g.
``git worktree add --detach /tmp/before 0b310af``) in one session: each round runs every case once
in a fresh process per version, versions interleaved (drift on a shared machine hits both), and
each version's figure is the median over the rounds. Process time excludes other jobs' CPU, not
their effect on caches and memory bandwidth: on a shared machine compare only figures taken side by
side. Where even that swings by 10% between rounds (seen with vLLM servers running), count
instructions instead, which load does not change: ``valgrind --tool=callgrind`` over a script that
builds the case and the ``Simulator``, once with ``sim.run()`` and once without, per version
(``PYTHONPATH=SRC``); the difference of the two "Collected" totals is the run's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import prfaas.sim as _sim
from prfaas.analytic import plan
from prfaas.sim import LinkConfig, Simulator, paper_deployment

# ``--before`` runs this script on an older source, where the simulator's site view was named
# ``SiteConfig`` (renamed ``SimSite`` so that one name means one thing: the file's site).
SimSite: Any = getattr(_sim, "SimSite", None) or _sim.SiteConfig  # type: ignore[attr-defined]

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared/traces/mooncake_conversation_trace.jsonl"


def _time(sc: Any) -> tuple[float, int, int]:
    t0 = time.process_time()
    sim = Simulator(sc)
    m = sim.run()
    return time.process_time() - t0, m.num_arrived, sim.num_events


def paper_case(lam: float, duration_s: float) -> Any:
    return replace(paper_deployment("paper-prfaas", rate_rps=lam), duration_s=duration_s)


def mooncake_case(trace: Path = TRACE) -> Any:
    sc = paper_deployment("paper-prfaas")
    return replace(sc, trace=str(trace), prefix_cache=True, duration_s=4000.0)


def large_case(lam: float) -> Any:
    copies = 104
    sites = [SimSite(f"pd{i}", "pd", "h20", 3, 5) for i in range(copies)]
    sites.append(SimSite("prfaas", "prfaas", "h200", 1250 - 8 * copies))
    links = tuple(LinkConfig("prfaas", f"pd{i}", 100.0, 5.0) for i in range(copies))
    sc = paper_deployment("paper-prfaas")
    rate = 0.9 * lam * copies
    return replace(sc, sites=tuple(sites), links=links, duration_s=3600.0, drain_s=600.0,
                   arrival=replace(sc.arrival, rate_rps=rate))  # fmt: skip


def _cases(duration_s: float, trace: Path) -> dict[str, Any]:
    cases = {"paper_saturation": paper_case(plan().prfaas.lambda_max_exact, duration_s)}
    if trace.is_file():
        cases["mooncake_trace"] = mooncake_case(trace)
    return cases


def _summary(runs: list[tuple[float, int, int]]) -> dict[str, Any]:
    cpu = statistics.median(r[0] for r in runs)
    return {
        "requests": runs[0][1],
        "events": runs[0][2],
        "cpu_s": round(cpu, 3),
        "requests_per_cpu_s": round(runs[0][1] / cpu),
        "runs": len(runs),
    }


def _worker_round(src: str, args: argparse.Namespace) -> dict[str, tuple[float, int, int]]:
    """One run of every case in a fresh process importing prfaas from ``src``."""
    cmd = [sys.executable, __file__, "--worker", "--duration", str(args.duration),
           "--trace", str(args.trace)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"the run importing prfaas from {src} failed:\n{out.stderr[-2000:]}")
    line = next(x for x in out.stdout.splitlines() if x.startswith("{"))
    result = json.loads(line)
    # An installed prfaas answers when ``src`` holds none: a silent self-comparison otherwise.
    imported = Path(result.pop("prfaas_from")).resolve()
    if not imported.is_relative_to(Path(src).resolve()):
        raise SystemExit(f"importing prfaas from {src} failed: it came from {imported}")
    return {k: (v[0], v[1], v[2]) for k, v in result.items()}


def _side_by_side(args: argparse.Namespace) -> dict[str, Any]:
    versions = {"before": str(Path(args.before).resolve()), "after": str(ROOT / "src")}
    runs: dict[str, dict[str, list[tuple[float, int, int]]]] = {v: {} for v in versions}
    for rnd in range(args.runs):
        for name, src in versions.items():
            for case, r in _worker_round(src, args).items():
                runs[name].setdefault(case, []).append(r)
        print(f"round {rnd + 1}/{args.runs} done", file=sys.stderr, flush=True)
    out: dict[str, Any] = {"before_src": versions["before"], "rounds": args.runs}
    for case in runs["after"]:
        b, a = _summary(runs["before"][case]), _summary(runs["after"][case])
        out[case] = {"before": b, "after": a,
                     "cpu_change": round(a["cpu_s"] / b["cpu_s"] - 1, 4)}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--duration", type=float, default=3000.0, help="paper case: seconds of arrivals"
    )
    ap.add_argument("--large", action="store_true", help="also the 1,250-instance hour")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--before", help="src folder of another commit, measured side by side")
    ap.add_argument("--trace", type=Path, default=TRACE, help="the Mooncake conversation trace")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        import prfaas

        once: dict[str, Any] = {n: _time(sc) for n, sc in _cases(args.duration, args.trace).items()}
        once["prfaas_from"] = prfaas.__file__
        print(json.dumps(once))
        return
    if args.before:
        result = _side_by_side(args)
        if args.json:
            print(json.dumps(result))
            return
        print(f"CPU s, median of {args.runs} interleaved rounds (shared, noisy machine): "
              f"before = {result['before_src']}, after = this checkout")  # fmt: skip
        for case, v in result.items():
            if isinstance(v, dict):
                b, a = v["before"], v["after"]
                print(f"{case}: before {b['cpu_s']:.3f} s ({b['requests_per_cpu_s']} req/CPU-s), "
                      f"after {a['cpu_s']:.3f} s ({a['requests_per_cpu_s']} req/CPU-s), "
                      f"{v['cpu_change']:+.1%}")  # fmt: skip
        return
    out: dict[str, Any] = {}
    for name, sc in _cases(args.duration, args.trace).items():
        out[name] = _summary([_time(sc) for _ in range(args.runs)])
    if args.large:
        cpu, n, events = _time(large_case(plan().prfaas.lambda_max_exact))
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
