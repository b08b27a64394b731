"""``prfaas sim``: simulate a deployment (defaults: the paper's case study, PrfaaS-PD).

The deployment comes from a deployment file (``prfaas sim FILE``: the file ``prfaas up`` runs,
with its ``workload:`` and ``simulation:`` sections), from an older scenario YAML (``--config``,
keys: ``SimScenario`` fields), or from the paper's case study (``--deployment paper-...``).
Flags override the file: a flag overrides only when it is given (every flag's default is None
and the paper defaults below apply only without a file). ``--find-max-rate`` searches the highest
sustainable arrival rate (rule: ``prfaas.sim.maxrate``). ``--json`` prints one object (schema:
docs/simulation.md). Bad input -> one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prfaas.errors import UsageError

if TYPE_CHECKING:
    # Type-only: the simulator is imported when a command runs, to keep `prfaas --help` quick.
    from prfaas.sim import SimScenario

PAPER_DEFAULTS: dict[str, Any] = {
    "arrival": "uniform",
    "cv": 2.0,
    "on_s": 10.0,
    "on_fraction": 0.5,
    "rate_scale": 1.0,
    "duration": 600.0,
    "seed": 0,
    "link_gbps": 100.0,
    "rtt_ms": 5.0,
    "connections": 8,
    "window_mib": 16.0,
    "output_tokens": 1024,
    "mu": 9.90,
    "sigma": 1.00,
    "warmup": 0.0,
}
"""Without a file, what the case study uses for a flag that is not given."""


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
    a("--config", type=Path, default=None, help="older scenario YAML (keys: SimScenario fields)")
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
    p.set_defaults(run=run)


def _schedule(text: str) -> tuple[tuple[float, float], ...]:
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        try:
            t_s, gbps = (float(x) for x in item.split(":"))
        except ValueError:
            raise UsageError(f"--link-schedule: bad step {item!r} (want TIME_S:GBPS)") from None
        if t_s < 0 or gbps < 0 or not math.isfinite(t_s + gbps):
            raise UsageError(f"--link-schedule: step {item!r} must be >= 0")
        out.append((t_s, gbps))
    return tuple(out)


def _from_scenario_yaml(path: Path) -> SimScenario:
    from prfaas.config import load_yaml_mapping
    from prfaas.sim import LengthConfig, LinkConfig, SimScenario, SiteConfig
    from prfaas.workload import ArrivalSpec

    data = load_yaml_mapping(path)
    known = set(SimScenario.__dataclass_fields__)
    bad = sorted(set(data) - known)
    if bad:
        raise UsageError(f"{path}: unknown scenario key(s) {', '.join(bad)}")
    try:
        data["sites"] = tuple(SiteConfig(**s) for s in data.get("sites", ()))
        links = []
        for lk in data.get("links", ()):
            lk = dict(lk)
            lk["schedule"] = tuple(tuple(x) for x in lk.get("schedule", ()))
            links.append(LinkConfig(**lk))
        data["links"] = tuple(links)
        if "arrival" in data:
            data["arrival"] = ArrivalSpec(**data["arrival"])
        if "lengths" in data:
            data["lengths"] = LengthConfig(**data["lengths"])
        return SimScenario(**data)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{path}: {exc}") from None


def _from_deployment_file(path: Path) -> tuple[SimScenario, float | None]:
    """(scenario, the planner's lambda_max_exact for exactly this deployment, when it is the
    planner's two-cluster kind: one PD site, PrfaaS sites or none)."""
    from prfaas.config import load_deployment
    from prfaas.scenarios import planned_threshold, planner_for, sim_scenario

    d = load_deployment(path)
    sc = sim_scenario(d)
    exact: float | None = None
    if len(d.pd_sites) == 1 and sc.trace is None:
        home = next(s for s in sc.sites if s.kind == "pd")
        n_prfaas = sum(s.num_prefill for s in sc.sites if s.kind == "prfaas")
        offloads = n_prfaas > 0 and d.policy.router != "local_only"
        t = planned_threshold(d) if offloads else None
        planner = planner_for(d, n_local=max(2, home.num_prefill + home.num_decode))
        exact = planner.evaluate(t, n_prfaas if offloads else 0, home.num_prefill,
                                 home.num_decode).lambda_max_exact  # fmt: skip
    if d.workload.arrival.rate_rps is None and exact:
        sc = replace(sc, arrival=replace(sc.arrival, rate_rps=0.8 * exact))
    return sc, exact


def _multi_site(sc: SimScenario, args: argparse.Namespace) -> SimScenario:
    """Replicate the PD site ``--pd-sites`` times and the PrfaaS site ``--prfaas-sites`` times."""
    from prfaas.sim import LinkConfig, SiteConfig

    pd = next(s for s in sc.sites if s.kind == "pd")
    remote = [s for s in sc.sites if s.kind == "prfaas"]
    sites: list[SiteConfig] = [
        replace(pd, name=f"pd{i}" if args.pd_sites > 1 else pd.name) for i in range(args.pd_sites)
    ]
    links: list[LinkConfig] = []
    if remote:
        base = sc.links[0]
        for j in range(args.prfaas_sites):
            r = replace(remote[0], name=f"prfaas{j}" if args.prfaas_sites > 1 else remote[0].name)
            sites.append(r)
            for s in sites[: args.pd_sites]:
                links.append(replace(base, src=r.name, dst=s.name))
    return replace(sc, sites=tuple(sites), links=tuple(links))


def _check_flags(args: argparse.Namespace) -> None:
    for name in ("duration", "rate", "rate_scale", "link_gbps", "cv", "on_s", "window_mib"):
        v = getattr(args, name)
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {v:g}")
    for name in ("pd_sites", "prfaas_sites", "connections", "output_tokens", "max_rate_requests"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0")
    if args.rtt_ms is not None and args.rtt_ms < 0:
        raise UsageError("--rtt-ms must be >= 0")
    if args.sigma is not None and not args.sigma > 0:
        raise UsageError(f"--sigma must be > 0, got {args.sigma:g}")
    if args.mu is not None and not math.isfinite(args.mu):
        raise UsageError(f"--mu must be finite, got {args.mu:g}")
    if args.requests_csv is not None and not args.requests_csv.parent.is_dir():
        raise UsageError(f"--requests-csv: folder {args.requests_csv.parent} does not exist")
    if args.file is not None and args.config is not None:
        raise UsageError("give a deployment file or --config, not both")
    from_file = args.file is not None or args.config is not None
    if from_file and (args.n_p is not None or args.n_d is not None):
        raise UsageError("--n-p/--n-d size the paper deployments; a file gives its node counts")
    if args.file is not None and (args.pd_sites > 1 or args.prfaas_sites > 1):
        raise UsageError("--pd-sites/--prfaas-sites replicate the paper deployments; a file "
                         "lists its sites itself")  # fmt: skip


def _paper(args: argparse.Namespace) -> tuple[SimScenario, float | None]:
    from prfaas.sim import DEPLOYMENTS, paper_deployment
    from prfaas.sim.scenario import paper_plan

    if args.deployment not in DEPLOYMENTS:
        raise UsageError(
            f"unknown deployment {args.deployment!r} (known: {', '.join(DEPLOYMENTS)})"
        )
    value = _with_paper_defaults(args)
    sc = paper_deployment(
        args.deployment, threshold_tokens=args.threshold, n_p=args.n_p, n_d=args.n_d,
        link_gbps=value("link_gbps"), rtt_s=value("rtt_ms") / 1000,
    )  # fmt: skip
    if args.pd_sites > 1 or args.prfaas_sites > 1:
        sc = _multi_site(sc, args)
    res = paper_plan(value("link_gbps"))
    exact: float | None = {
        "paper-prfaas": res.prfaas, "paper-homogeneous": res.homogeneous,
        "paper-naive": res.naive,
    }[args.deployment].lambda_max_exact * args.pd_sites  # fmt: skip
    if args.n_p is not None or args.n_d is not None or args.prfaas_sites > 1:
        exact = None  # not the planner's deployment any more
    return sc, exact


def _with_paper_defaults(args: argparse.Namespace) -> Callable[[str], Any]:
    def value(name: str) -> Any:
        v = getattr(args, name)
        return PAPER_DEFAULTS[name] if v is None else v

    return value


def build_scenario(args: argparse.Namespace) -> tuple[SimScenario, float | None]:
    """(scenario, the planner's lambda_max_exact for the deployment or None). Flags given
    override the file; without a file the paper defaults fill the rest."""
    from prfaas.workload import ArrivalSpec

    _check_flags(args)
    from_file = args.file is not None or args.config is not None
    if args.file is not None:
        sc, exact = _from_deployment_file(args.file)
    elif args.config is not None:
        sc, exact = _from_scenario_yaml(args.config), None
    else:
        sc, exact = _paper(args)

    # Without a file every setting has its paper value; with one, only flags given change it.
    def given(name: str) -> bool:
        return not from_file or getattr(args, name) is not None

    value = _with_paper_defaults(args)
    changes: dict[str, Any] = {}
    if from_file:
        link_changes: dict[str, Any] = {}
        if given("link_gbps"):
            link_changes["bandwidth_gbps"] = args.link_gbps
        if given("rtt_ms"):
            link_changes["rtt_s"] = args.rtt_ms / 1000
        if given("connections"):
            link_changes["connections"] = args.connections
        if given("window_mib"):
            link_changes["window_bytes"] = args.window_mib * 2**20
        if args.link_schedule is not None:
            link_changes["schedule"] = _schedule(args.link_schedule)
        if link_changes:
            changes["links"] = tuple(replace(lk, **link_changes) for lk in sc.links)
        if args.threshold is not None:
            changes["threshold_tokens"] = args.threshold
    elif sc.links:
        link = replace(
            sc.links[0], connections=value("connections"),
            window_bytes=value("window_mib") * 2**20,
            schedule=_schedule(args.link_schedule or ""),
        )  # fmt: skip
        changes["links"] = tuple(replace(lk, connections=link.connections,
                                         window_bytes=link.window_bytes, schedule=link.schedule)
                                 for lk in sc.links)  # fmt: skip
    base = sc.arrival
    rate = args.rate if args.rate is not None else (
        base.rate_rps if from_file or not exact else 0.8 * exact
    )  # fmt: skip
    changes["arrival"] = ArrivalSpec(
        args.arrival if args.arrival is not None else (base.kind if from_file else "uniform"),
        rate,
        *(
            getattr(args, n) if getattr(args, n) is not None
            else (getattr(base, n) if from_file else PAPER_DEFAULTS[n])
            for n in ("cv", "on_s", "on_fraction")
        ),
    )  # fmt: skip
    plain = (("seed", "seed"), ("warmup", "warmup_s"), ("duration", "duration_s"),
             ("output_tokens", "output_tokens"))  # fmt: skip
    for flag, field_name in plain:
        if given(flag):
            changes[field_name] = value(flag)
    if args.policy is not None:
        changes["policy"] = args.policy
    if args.trace is not None:
        changes.update(trace=str(args.trace), trace_limit=args.trace_limit,
                       rate_scale=value("rate_scale"), prefix_cache=not args.no_cache)  # fmt: skip
    else:
        if args.no_cache:
            changes["prefix_cache"] = False
        if args.trace_limit is not None:
            changes["trace_limit"] = args.trace_limit
        if args.rate_scale is not None:
            changes["rate_scale"] = args.rate_scale
    if args.rebalance:
        changes["rebalance"] = True
    if args.no_tune:
        changes["tune"] = False
    if args.mu is not None or args.sigma is not None:
        changes["lengths"] = replace(
            sc.lengths, mu=args.mu if args.mu is not None else sc.lengths.mu,
            sigma=args.sigma if args.sigma is not None else sc.lengths.sigma,
        )  # fmt: skip
    if args.timeseries or args.plot is not None:
        changes["timeseries"] = True
    sc = replace(sc, **changes)
    if sc.trace is not None and args.duration is None and not _file_sets_duration(args):
        # A trace replays whole unless a duration is asked for (it used to stop at 600 s, 15%
        # of the shipped trace, without saying so).
        span = trace_span(sc)
        sc = replace(sc, duration_s=span.last_arrival_s + 1e-6)
    return sc, exact


def _file_prices(args: argparse.Namespace) -> dict[str, float]:
    if args.file is None:
        return {}
    from prfaas.config import load_deployment

    return dict(load_deployment(args.file).prices)


def sim_money(sc: SimScenario, out: dict[str, Any], prices: dict[str, float]) -> dict[str, Any]:
    """$/hour of the simulated deployment and $ per million tokens at the throughput it reached
    (prices from the file's ``prices:``, else the stated assumption)."""
    from prfaas.analytic.prices import instances_by_hardware, money

    instances = instances_by_hardware(
        sc.model, ((site.hardware, site.num_prefill + site.num_decode) for site in sc.sites)
    )
    m = money(instances, prices, out["prompt_tokens_per_s"], out["output_tokens_per_s"])
    return {"unpriced": sorted(instances)} if m is None else m.as_dict()


def _file_sets_duration(args: argparse.Namespace) -> bool:
    if args.file is None:
        return args.config is not None  # an older scenario YAML: its duration as before
    from prfaas.config import load_deployment

    return "duration_s" in load_deployment(args.file).workload.model_fields_set


@dataclass(frozen=True, slots=True)
class TraceSpan:
    num_records: int
    """Records the replay reads (all, or ``trace_limit``)."""
    last_arrival_s: float
    """When the last of them arrives, after ``rate_scale``."""


def trace_span(sc: SimScenario) -> TraceSpan:
    from prfaas.workload import read_mooncake

    assert sc.trace is not None
    n, last = 0, 0.0
    for record in read_mooncake(sc.trace, sc.trace_limit):
        n, last = n + 1, record.arrival_s
    return TraceSpan(n, last / sc.rate_scale)


def trace_coverage(sc: SimScenario, num_arrived: int) -> dict[str, Any]:
    """How much of the trace the run replayed: it stops at ``duration_s``."""
    span = trace_span(sc)
    return {
        "path": sc.trace,
        "records": span.num_records,
        "replayed": num_arrived,
        "replayed_share": num_arrived / span.num_records if span.num_records else 0.0,
        "trace_span_s": span.last_arrival_s,
        "duration_s": sc.duration_s,
    }


def _run_one(sc: SimScenario, progress: bool, requests_csv: Path | None = None) -> dict[str, Any]:
    from prfaas.sim import Simulator, summary
    from prfaas.sim.request_log import RequestLog

    sim = Simulator(sc)
    log = RequestLog({str(n.node_id): str(n.site_id) for n in sim.nodes})
    if requests_csv is not None:
        sim.on_finish = log
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
    if requests_csv is not None:
        _write_csv(requests_csv, log.table())
    return summary(sim)


def _write_csv(path: Path, rows: list[tuple[object, ...]]) -> None:
    """Write to a temporary file beside ``path``, then rename: never a half-written CSV."""
    import csv
    import os
    import tempfile

    from prfaas.sim.request_log import COLUMNS

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            writer.writerows(rows)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def run(args: argparse.Namespace) -> int:
    from prfaas.sim import ScenarioError
    from prfaas.workload import TraceError

    try:
        sc, exact = build_scenario(args)
        sc.validate()
        if args.find_max_rate:
            from prfaas.sim import MaxRateRule, find_max_rate

            if sc.trace is not None:
                raise UsageError("--find-max-rate needs synthetic arrivals, not --trace")
            start = exact or sc.arrival.rate_rps
            res = find_max_rate(replace(sc, stratified=True), start,
                                MaxRateRule(num_requests=args.max_rate_requests))  # fmt: skip
            out: dict[str, Any] = {
                "schema": "prfaas.sim.max_rate/1",
                "max_rate_rps": res.max_rate_rps,
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
            out = _run_one(sc, progress=not args.json, requests_csv=args.requests_csv)
            if sc.trace is not None:
                out["trace"] = trace_coverage(sc, out["requests"]["arrived"])
            out["money"] = sim_money(sc, out, _file_prices(args))
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
