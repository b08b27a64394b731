"""What ``prfaas sim`` simulates: the ``SimScenario`` built from a deployment file or the paper's
case study (the older scenario YAML, ``--config``, is refused with how to convert it), with the
flags given over it (every flag's default is None; the paper defaults apply only without a
file), the planner's capacity for it, and what a trace replay covers. Also the run's money
(``analytic.prices``). The command itself, its flags and its output are ``commands/sim.py``.
"""

from __future__ import annotations

import argparse
import math
import sys
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


CONFIG_GONE = (
    "--config {path}: the scenario YAML (SimScenario keys) is gone; `prfaas sim` and `prfaas plan` "
    "read deployment files (the file `prfaas up` runs). Convert it: sites' num_prefill/num_decode "
    "-> prefill_nodes/decode_nodes, links' bandwidth_gbps -> gbps and rtt_s -> rtt_ms (x1000), "
    "policy -> policy.router, threshold_tokens -> policy.threshold_tokens, arrival/lengths/"
    "duration_s/seed/trace/output_tokens -> workload:, the rest -> simulation:; add engine: "
    "{{kind: timed, model: MODEL}}; then `prfaas sim FILE` (docs/deployment-file.md; "
    "docs/examples/two_tenants.yaml is a converted example)"
)
"""What ``--config`` answers: how to convert an old scenario YAML."""


def _from_deployment_file(
    path: Path, trace: str | None = None, trace_limit: int | None = None
) -> tuple[SimScenario, float | None]:
    """(scenario, the planner's lambda_max_exact for exactly this deployment, when it is the
    planner's two-cluster kind: one PD site, PrfaaS sites or none). ``trace`` (``--trace``)
    replaces the file's workload: its prompt lengths plan ``t`` and the planner's figure."""
    from prfaas.config import load_deployment
    from prfaas.scenarios import planner_for, sim_scenario, workload_lengths

    d = load_deployment(path)
    wl = workload_lengths(d, trace, trace_limit)
    if wl.warning:
        print(f"warning: {wl.warning}", file=sys.stderr)
    sc = sim_scenario(d, trace, trace_limit)
    exact: float | None = None
    if len(d.pd_sites) == 1:
        home = next(s for s in sc.sites if s.kind == "pd")
        n_prfaas = sum(s.num_prefill for s in sc.sites if s.kind == "prfaas")
        offloads = n_prfaas > 0 and d.policy.router != "local_only"
        t = sc.threshold_tokens if offloads else None
        planner = planner_for(d, lengths=wl.lengths,
                              n_local=max(2, home.num_prefill + home.num_decode))  # fmt: skip
        exact = planner.evaluate(t, n_prfaas if offloads else 0, home.num_prefill,
                                 home.num_decode).lambda_max_exact  # fmt: skip
    if d.workload.arrival.rate_rps is None and exact:
        sc = replace(sc, arrival=replace(sc.arrival, rate_rps=0.8 * exact))
    return sc, exact


def _multi_site(sc: SimScenario, args: argparse.Namespace) -> SimScenario:
    """Replicate the PD site ``--pd-sites`` times and the PrfaaS site ``--prfaas-sites`` times."""
    from prfaas.sim import LinkConfig, SimSite

    pd = next(s for s in sc.sites if s.kind == "pd")
    remote = [s for s in sc.sites if s.kind == "prfaas"]
    sites: list[SimSite] = [
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
    if args.config is not None:
        raise UsageError(CONFIG_GONE.format(path=args.config))
    from_file = args.file is not None
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
    threshold = args.threshold
    if threshold is None and args.trace is not None and args.deployment == "paper-prfaas":
        threshold = _trace_threshold(args, value("link_gbps"))
    sc = paper_deployment(
        args.deployment, threshold_tokens=threshold, n_p=args.n_p, n_d=args.n_d,
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


def _trace_threshold(args: argparse.Namespace, link_gbps: float) -> int:
    """The paper deployment's ``t`` re-planned over the trace's prompt lengths (not the
    log-normal's), at the deployment's own split: the rule of ``scenarios.planned_threshold``."""
    from prfaas.analytic import EmpiricalLengths, Planner, Scenario
    from prfaas.sim.scenario import paper_plan
    from prfaas.workload import read_mooncake

    values = [r.num_prompt_tokens for r in read_mooncake(args.trace, args.trace_limit)]
    if not values:
        raise UsageError(f"trace {args.trace}: no records")
    d = paper_plan(link_gbps).prfaas
    n_p = d.n_p if args.n_p is None else args.n_p
    n_d = d.n_d if args.n_d is None else args.n_d
    scenario = Scenario(link_gbps=link_gbps, n_local=n_p + n_d,
                        lengths=EmpiricalLengths(values, label=f"trace {args.trace}"))  # fmt: skip
    return int(Planner(scenario).plan(n_p=n_p).prfaas.threshold_tokens or 0)


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
    from_file = args.file is not None
    if args.file is not None:
        trace = None if args.trace is None else str(args.trace)
        sc, exact = _from_deployment_file(args.file, trace, args.trace_limit)
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
            link_changes["gbps"] = args.link_gbps
        if given("rtt_ms"):
            link_changes["rtt_ms"] = args.rtt_ms
        if given("connections"):
            link_changes["connections"] = args.connections
        if given("window_mib"):
            link_changes["window_mib"] = args.window_mib
        if args.link_schedule is not None:
            link_changes["schedule"] = _schedule(args.link_schedule)
        if link_changes:
            changes["links"] = tuple(replace(lk, **link_changes) for lk in sc.links)
        if args.threshold is not None:
            changes["threshold_tokens"] = args.threshold
    elif sc.links:
        link = replace(
            sc.links[0], connections=value("connections"), window_mib=value("window_mib"),
            schedule=_schedule(args.link_schedule or ""),
        )  # fmt: skip
        changes["links"] = tuple(replace(lk, connections=link.connections,
                                         window_mib=link.window_mib, schedule=link.schedule)
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


def file_prices(args: argparse.Namespace) -> dict[str, float]:
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
        return False
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
