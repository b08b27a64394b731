"""``prfaas sim``: simulate a deployment (defaults: the paper's case study, PrfaaS-PD).

The deployment comes from a deployment file (``prfaas sim FILE``: the file ``prfaas up`` runs,
with its ``workload:`` and ``simulation:`` sections) or from the paper's case study
(``--deployment paper-...``); the older scenario YAML (``--config``) is refused with how to
convert it.
Flags override the file: a flag overrides only when it is given (every flag's default is None;
the paper defaults, ``sim_build.PAPER_DEFAULTS``, apply only without a file; building the scenario
is ``sim_build.py``). ``--find-max-rate`` searches the highest sustainable arrival rate (rule:
``prfaas.sim.maxrate``). ``--json`` prints one object (schema: docs/simulation.md). Bad input ->
one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prfaas.commands.outputs import check_output, write_requests_csv, write_trace
from prfaas.commands.sim_build import (
    build_scenario,
    file_prices,
    sim_money,
    trace_coverage,
)
from prfaas.errors import UsageError

if TYPE_CHECKING:
    # Type-only: the simulator is imported when a command runs, to keep `prfaas --help` quick.
    from prfaas.sim import SimScenario


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sim",
        help="discrete-event simulation of a PrfaaS deployment",
        description=(
            "Simulate a PrfaaS / PD deployment with the same policy code as the live system: "
            "queues, bursts, prefix caches, a shared inter-site link with TCP window caps and "
            "capacity dips, rebalancing. Give the deployment file `prfaas up` runs (its "
            "workload: and simulation: sections apply; flags override them), or nothing for the "
            "paper's case study (PrfaaS-PD, t and N_p/N_d from the planner, uniform arrivals, "
            "log-normal prompts, 1024 output tokens). [paper: X] is the default without a file."
        ),
    )
    a = p.add_argument
    a("file", nargs="?", type=Path, default=None, metavar="DEPLOYMENT.yaml",
      help="deployment file (as for prfaas up); flags override it")  # fmt: skip
    a("tenant_files", nargs="*", type=Path, metavar="TENANT.yaml",
      help="after a pool file, the tenants' files: prfaas sim pool.yaml tenant-*.yaml")  # fmt: skip
    a("--config", type=Path, default=None,
      help="gone (the older scenario YAML): says how to convert it")  # fmt: skip
    a(
        "--deployment",
        default="paper-prfaas",
        help="without a file: paper-prfaas | paper-homogeneous | paper-naive (Table 6 counts)",
    )
    a("--policy", default=None, help="router: local_only | naive | threshold | prfaas")
    a("--arrival", default=None, help="uniform | poisson | gamma | onoff [paper: uniform]")
    a("--rate", type=float, default=None,
      help="mean arrival rate, req/s [default: 80%% of the planner's capacity]")  # fmt: skip
    a("--cv", type=float, default=None, help="gamma arrivals: inter-arrival CV [paper: 2]")
    a("--on-s", type=float, default=None, help="onoff arrivals: mean on period, s [paper: 10]")
    a("--on-fraction", type=float, default=None, help="onoff: share of time on [paper: 0.5]")
    a("--trace", type=Path, default=None, help="Mooncake JSONL trace to replay")
    a("--trace-limit", type=int, default=None, help="replay only the first N requests")
    a("--rate-scale", type=float, default=None, help="trace: >1 replays faster [paper: 1]")
    a("--duration", type=float, default=None, help="seconds of arrivals [paper: 600]")
    a("--seed", type=int, default=None, help="[paper: 0]")
    a("--threshold", type=int, default=None, help="offload threshold t, tokens")
    a("--n-p", type=int, default=None, help="local prefill nodes (paper deployments)")
    a("--n-d", type=int, default=None, help="local decode nodes (paper deployments)")
    a("--pd-sites", type=int, default=1, help="paper deployments: PD sites sharing PrfaaS site(s)")
    a("--prfaas-sites", type=int, default=1, help="paper deployments: PrfaaS sites (4 nodes each)")
    a("--link-gbps", type=float, default=None, help="inter-site bandwidth [paper: 100]")
    a("--rtt-ms", type=float, default=None, help="inter-site round-trip time [paper: 5]")
    a("--connections", type=int, default=None, help="TCP connections per transfer [paper: 8]")
    a("--window-mib", type=float, default=None, help="TCP window per connection, MiB [paper: 16]")
    a("--link-schedule", default=None, help="capacity steps 'TIME_S:GBPS,...' e.g. '60:10,120:100'")
    a("--rebalance", action="store_true", help="enable the P/D rebalancer")
    a("--no-tune", action="store_true", help="prfaas policy: do not re-search t online")
    a("--no-cache", action="store_true", help="disable prefix caching")
    a("--output-tokens", type=int, default=None, help="[paper: 1024]")
    a("--mu", type=float, default=None, help="log-normal mu of prompt length [paper: 9.90]")
    a("--sigma", type=float, default=None, help="log-normal sigma of prompt length [paper: 1.00]")
    a("--warmup", type=float, default=None, help="seconds of arrivals not counted [paper: 0]")
    a("--find-max-rate", action="store_true", help="search the highest sustainable rate")
    a("--max-rate-requests", type=int, default=20000, help="requests per max-rate trial")
    a("--json", action="store_true", help="print one JSON object")
    a("--timeseries", action="store_true", help="include 1 s time series in the JSON")
    a("--plot", type=Path, default=None, help="write PNG plots to this folder")
    a("--requests-csv", type=Path, default=None, metavar="FILE",
      help="write one row per finished request (arrival, route, nodes, queueing, TTFT, e2e, "
      "bytes crossed, prefix hit)")  # fmt: skip
    a("--perfetto", type=Path, default=None, metavar="FILE",
      help="write a Chrome / Perfetto trace (JSON; open in ui.perfetto.dev): a track per node "
      "and per link, a span per request's prefill, KV transfer and decode")  # fmt: skip
    p.set_defaults(run=run)


def _run_one(
    sc: SimScenario, progress: bool, requests_csv: Path | None = None,
    perfetto: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    from prfaas.sim import Simulator, summary
    from prfaas.sim.perfetto import TraceLog, both
    from prfaas.sim.request_log import RequestLog

    sim = Simulator(sc)
    site_of = {str(n.node_id): str(n.site_id) for n in sim.nodes}
    log = RequestLog(site_of) if requests_csv is not None else None
    spans = TraceLog(site_of) if perfetto is not None else None
    sim.on_finish = both(log, spans)
    horizon = sc.duration_s + sc.drain_s
    start = time.monotonic()
    step = horizon / 50
    until = 0.0
    shown = False
    while not sim.done and until < horizon:
        until = min(horizon, until + step)
        sim.run(until_s=until)
        if progress and sys.stderr.isatty() and time.monotonic() - start > 3:
            shown = True
            pct = 100 * min(1.0, sim.now / max(sc.duration_s, 1e-9))
            print(f"\rsimulating: {pct:5.1f}% of arrivals, {sim.metrics.num_completed} done",
                  end="", file=sys.stderr)  # fmt: skip
    if shown:
        print(file=sys.stderr)
    if requests_csv is not None and log is not None:
        write_requests_csv(requests_csv, log.table())
    if perfetto is not None and spans is not None:
        from prfaas.sim.perfetto import build_trace

        write_trace(perfetto, build_trace(spans.spans, title="prfaas sim"))
    return summary(sim)


def run(args: argparse.Namespace) -> int:
    from prfaas.sim import ScenarioError
    from prfaas.workload import TraceError

    if args.file is not None and _is_pool(args.file, args.tenant_files):
        from prfaas.commands.sim_pool import run_pool

        return run_pool(args)
    try:
        if args.file is not None:
            from prfaas.config import load_deployment

            deployment = load_deployment(args.file)
            if deployment.autoscale is not None:  # an elastic pool: its own simulator
                from prfaas.commands.sim_elastic import run_elastic

                return run_elastic(args, deployment)
        check_output("--perfetto", args.perfetto)
        check_output("--requests-csv", args.requests_csv)  # before the run, not after it
        sc, exact = build_scenario(args)
        sc.validate()
        if args.find_max_rate:
            from prfaas.capacity import search

            if args.perfetto is not None or args.requests_csv is not None:
                raise UsageError("--find-max-rate runs many trials: --perfetto and "
                                 "--requests-csv export one run, drop them")  # fmt: skip
            res = search(sc, exact, args.max_rate_requests)
            bounds: dict[str, float] = {}
            if args.file is not None:  # the file's measured plumbing ceilings (capacity.py)
                from prfaas.capacity import plumbing_bounds
                from prfaas.config import load_deployment

                found = plumbing_bounds(load_deployment(args.file), sc)
                bounds = {b.what: b.rate_rps for b in found}
            out: dict[str, Any] = {
                "schema": "prfaas.sim.max_rate/1",
                "max_rate_rps": res.max_rate_rps,
                "capacity_rps": min([res.max_rate_rps, *bounds.values()]),
                "plumbing_bounds_rps": bounds,
                "workload": "trace" if sc.trace is not None else "synthetic",
                "lambda_max_exact": exact,
                "ratio_to_exact": res.max_rate_rps / exact if exact else None,
                "rule": {
                    "num_requests": res.rule.num_requests,
                    "backlog_fraction": res.rule.backlog_fraction,
                    "rel_tol": res.rule.rel_tol,
                },
                "trials": [
                    {
                        "rate_rps": t.rate_rps,
                        "passed": t.passed,
                        "worst_stage": t.worst_stage,
                        "worst_backlog_s": t.worst_backlog_s,
                    }
                    for t in res.trials
                ],
            }
        else:
            out = _run_one(sc, progress=not args.json, requests_csv=args.requests_csv,
                           perfetto=args.perfetto)  # fmt: skip
            if sc.trace is not None:
                out["trace"] = trace_coverage(sc, out["requests"]["arrived"])
            out["money"] = sim_money(sc, out, file_prices(args))
            if args.plot is not None:
                _plots(args.plot, sc, out)
    except (ScenarioError, TraceError) as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(out, sort_keys=False))
    else:
        _print_human(out)
    return 0


def _is_pool(file: Path, tenant_files: list[Path]) -> bool:
    from prfaas.pool_file import is_pool_file

    if tenant_files and not is_pool_file(file):
        raise UsageError(f"{file}: tenant files follow a pool file (groups:, tenants:)")
    return bool(tenant_files) or is_pool_file(file)


def _print_human(out: dict[str, Any]) -> None:
    if "max_rate_rps" in out:
        ratio = out["ratio_to_exact"]
        extra = f" ({ratio:.4f} x lambda_max_exact {out['lambda_max_exact']:.4f})" if ratio else ""
        print(f"max_rate_rps: {out['max_rate_rps']:.4f}{extra}")
        return
    if "trace" in out:
        tr = out["trace"]
        print(f"trace {tr['path']}: replayed {tr['replayed']} of {tr['records']} records "
              f"({100 * tr['replayed_share']:.1f}%; {tr['duration_s']:.0f} s of "
              f"{tr['trace_span_s']:.0f} s)")  # fmt: skip
    req = out["requests"]
    m = out.get("money", {})
    money_line = (
        f"cost {m['usd_per_hour']:.2f} $/h ({m['prices']} prices): "
        f"{m['usd_per_million_prompt_tokens']:.4f} $ per M prompt tokens, "
        f"{m['usd_per_million_output_tokens']:.4f} $ per M output tokens"
        if "usd_per_hour" in m
        else ""
    )
    print(f"requests: {req['arrived']} arrived, {req['completed']} completed, "
          f"{req['offloaded']} offloaded, {req['rerouted']} rerouted")  # fmt: skip
    print(f"throughput {out['throughput_rps']:.3f} req/s, goodput {out['goodput_rps']:.3f} req/s")
    if money_line:
        print(money_line)
    for key in ("ttft_s", "tpot_s"):
        d = out[key]
        print(f"{key}: mean {d['mean']:.3f} p50 {d['p50']:.3f} p90 {d['p90']:.3f} "
              f"p99 {d['p99']:.3f}")  # fmt: skip
    for sid, s in out["sites"].items():
        print(f"site {sid}: prefilled {s['requests_prefilled']}, prefill util "
              f"{s['prefill_utilisation']:.2f}, decode util {s['decode_utilisation']:.2f}, "
              f"hit rate {s['prefix_hit_rate']:.3f}")  # fmt: skip
    for lid, lk in out["links"].items():
        if lk["num_transfers"]:
            print(f"link {lid}: {lk['bytes_moved'] / 1e9:.1f} GB, mean {lk['mean_gbps']:.2f} Gbps,"
                  f" peak backlog {lk['peak_backlog_bytes'] / 1e9:.2f} GB")  # fmt: skip


def _plots(folder: Path, sc: SimScenario, out: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    # TTFT CDF per policy: the scenario re-run under each router that applies to it.
    policies = [sc.policy] + [
        p for p in ("threshold", "prfaas") if p != sc.policy and any(s.kind == "prfaas"
                                                                     for s in sc.sites)
    ]  # fmt: skip
    fig, ax = plt.subplots(figsize=(6, 4))
    from prfaas.sim import Simulator

    for pol in policies:
        sim = Simulator(replace(sc, policy=pol, timeseries=False))
        m = sim.run()
        xs = sorted(m.ttft_s)
        if xs:
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=pol)
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("CDF")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / "ttft_cdf.png", dpi=120)
    plt.close(fig)
    ts = out.get("timeseries", {})
    t = ts.get("t_s", [])
    for prefix, fname, ylabel in (
        ("link_util:", "link_utilisation.png", "link utilisation"),
        ("prefill_queue:", "queue_depths.png", "requests queued"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, ys in ts.items():
            queues = prefix == "prefill_queue:" and key.startswith("decode_waiting:")
            if (key.startswith(prefix) or queues) and any(ys):
                ax.plot(t[: len(ys)], ys, label=key)
        ax.set_xlabel("time (s)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(folder / fname, dpi=120)
        plt.close(fig)
