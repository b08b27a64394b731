"""``prfaas sim FILE`` when the file has an ``autoscale:`` section: the elastic-pool simulator
(``prfaas.sim.elastic``) on the file's PrfaaS site, its home PD site's prefill nodes and link,
its workload (the trace under ``autoscale.load``'s rate shape, or synthetic arrivals), with the
same ``policy.Autoscaler`` the live provider drives. Prints node-hours per group (starting, busy,
idle), $ (on-demand and spot), scale events, preemptions, fallbacks, TTFT P50/P90 and SLO
attainment; ``--json`` one object; ``--plot DIR`` a PNG of nodes over time against the load.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prfaas.errors import UsageError

if TYPE_CHECKING:
    from prfaas.config import DeploymentConfig
    from prfaas.sim.elastic import ElasticReport, ElasticScenario

SCHEMA = "prfaas.sim.elastic/1"


def _records(d: DeploymentConfig, base: Path, duration_s: float) -> list[tuple[float, int]]:
    w = d.workload
    if w.trace is not None:
        from prfaas.workload import read_mooncake

        path = Path(w.trace)
        if not path.is_absolute() and (base / path).exists():
            path = base / path
        return [(r.arrival_s, r.num_prompt_tokens) for r in read_mooncake(path, w.trace_limit)]
    from prfaas.workload import TruncatedLogNormal, synthetic_requests
    from prfaas.workload.arrivals import ArrivalSpec

    a = w.arrival
    spec = ArrivalSpec(a.kind, a.rate_rps or 1.0, a.cv, a.on_s, a.on_fraction)
    lc = w.lengths
    dist = TruncatedLogNormal(lc.mu, lc.sigma, lc.min_tokens, lc.max_tokens)
    reqs = synthetic_requests(spec, dist, w.output_tokens, duration_s, random.Random(w.seed))
    return [(r.arrival_s, r.num_prompt_tokens) for r in reqs]


def elastic_scenario(
    d: DeploymentConfig, where: str, seed: int | None = None, warmup_s: float | None = None
) -> ElasticScenario:
    """The elastic simulator's scenario of ``d`` (``where``: the file, for errors): its
    ``autoscale:`` groups and policy on the scaled PrfaaS site's hardware, the home site's
    prefill nodes and link, the file's seed and warm-up unless given. The site's own prefill
    nodes (``prfaas up`` starts them and the autoscaler counts them as serving; its provider
    never drains them) are initial nodes of the first on-demand group, as live."""
    from prfaas.sim.elastic import ElasticScenario

    auto = d.autoscale
    assert auto is not None
    pools = [s for s in d.sites if s.kind == "prfaas"]
    pool = next((s for s in pools if s.name == auto.site), None) if auto.site else None
    if auto.site is not None and pool is None:
        raise UsageError(f"{where}: autoscale.site: no PrfaaS site named {auto.site!r}")
    pool = pool or (pools[0] if pools else None)
    if pool is None:
        raise UsageError(f"{where}: autoscale: the file has no PrfaaS site to scale")
    groups = [g.build(pool.hardware) for g in auto.groups]
    own = sum(1 for n in pool.nodes if n.role == "prefill")
    at = next((i for i, g in enumerate(groups) if not g.spot), 0)
    groups[at] = replace(groups[at], initial_nodes=groups[at].initial_nodes + own)
    home = d.home_site
    link = next((lk for lk in d.links if {lk.src, lk.dst} == {pool.name, home.name}), None)
    sc = ElasticScenario(
        groups=tuple(groups),
        autoscale=auto.policy(),
        model=d.engine.model,
        local_hardware=home.hardware,
        num_local_prefill=max(1, sum(1 for n in home.nodes if n.role == "prefill")),
        threshold_tokens=d.policy.threshold_tokens or 8192,
        ttft_slo_s=auto.ttft_target_s,
        link_gbps=link.gbps if link is not None else 100.0,
        rtt_s=(link.rtt_ms / 1000) if link is not None else 0.0,
        tick_s=auto.tick_s,
        rate_window_s=auto.rate_window_s,
        seed=d.workload.seed if seed is None else seed,
        measure_from_s=d.workload.warmup_s if warmup_s is None else warmup_s,
    )
    sc.validate()
    return sc


def file_bound(d: DeploymentConfig, where: Path) -> dict[str, Any]:
    """``prfaas plan``'s pool bound for a file with ``autoscale:``: its workload under the load
    shape (the arrivals ``prfaas sim`` replays), the prompts over the threshold offered to the
    pool, each interval's nodes at steady state (``sim.elastic.bound.pool_bound``), no
    simulation. The same figures as ``prfaas sim``'s ``steady_state_bound``."""
    from prfaas.perf import cost_model_for_hardware
    from prfaas.sim.elastic import warp
    from prfaas.sim.elastic.bound import BOUND_NOTE, pool_bound

    auto = d.autoscale
    assert auto is not None
    sc = elastic_scenario(d, str(where))
    duration_s = d.workload.duration_s
    records = _records(d, where.parent, duration_s)
    arrivals = warp(records, auto.load.build(), duration_s, d.workload.rate_scale)
    cm = cost_model_for_hardware(sc.model, sc.groups[0].hardware)
    bound = pool_bound(
        ((a.arrival_s, a.num_prompt_tokens) for a in arrivals), sc.threshold_tokens,
        lambda n: cm.prefill_s(n, 0), sc.bound_interval_s, auto.up_utilisation, duration_s,
    )  # fmt: skip
    return {"note": BOUND_NOTE, "interval_s": sc.bound_interval_s,
            "intervals": [[round(t, 1), n] for t, n in bound]}  # fmt: skip


def print_bound(intervals: list[list[float]]) -> None:
    if not intervals:
        return
    shown = " ".join(str(int(n)) for _, n in intervals[:48])
    more = " ..." if len(intervals) > 48 else ""
    step = intervals[1][0] if len(intervals) > 1 else 0
    print(f"steady-state bound, nodes per {step:g} s (ignores start-up): {shown}{more}")


def run_elastic(args: argparse.Namespace, d: DeploymentConfig) -> int:
    from prfaas.sim.elastic import ElasticSim, warp

    auto = d.autoscale
    assert auto is not None
    duration_s = args.duration if args.duration is not None else d.workload.duration_s
    sc = elastic_scenario(d, str(args.file), args.seed, args.warmup)
    records = _records(d, Path(args.file).parent, duration_s)
    scale = d.workload.rate_scale if args.rate_scale is None else args.rate_scale
    arrivals = warp(records, auto.load.build(), duration_s, scale)
    report = ElasticSim(sc, arrivals, duration_s).run()
    out = {"schema": SCHEMA, "duration_s": duration_s, **report.as_dict()}
    if args.plot is not None:
        out["plot"] = str(plot(report, Path(args.plot)))
    if args.json:
        print(json.dumps(out))
    else:
        _print_human(out, report)
    return 0


def _print_human(out: dict[str, Any], r: ElasticReport) -> None:
    print(f"elastic pool, {out['duration_s']:g} s: {out['requests']} requests "
          f"({out['offloaded']} to the pool, "
          f"{out['local_for_capacity']} local for lack of it)")  # fmt: skip
    print(f"node-hours {out['node_hours']:.2f}, ${out['usd']:.2f}")
    for name, g in out["groups"].items():
        kind = "spot" if g["spot"] else "on-demand"
        print(f"  {name} ({kind}): starting {g['starting_h']:.2f} h, busy {g['busy_h']:.2f} h, "
              f"idle {g['idle_h']:.2f} h, ${g['usd']:.2f}")  # fmt: skip
    print(f"TTFT P50 {out['ttft_p50_s']:.2f} s, P90 {out['ttft_p90_s']:.2f} s, "
          f"SLO attainment {100 * out['slo_attainment']:.2f}%")  # fmt: skip
    print(f"scale events: {out['scale_ups']} up, {out['scale_downs']} down; preemptions "
          f"{out['preemptions']} (finished {out['finished_on_notice']}, re-queued "
          f"{out['requeued_on_notice']}); on-demand fallbacks {out['fallbacks']}")  # fmt: skip
    print_bound(out["steady_state_bound"]["intervals"])
    for e in r.scale_events[:20]:
        print(f"  {e.at_s:8.0f} s {e.action} {e.num_nodes}: {e.reason}")
    if "plot" in out:
        print(f"plot: {out['plot']}")


def plot(r: ElasticReport, folder: Path) -> Path:
    """Nodes (serving, starting, desired) over time against the offered load; one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    t = [s.at_s / 60 for s in r.samples]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    serving = [s.num_serving for s in r.samples]
    starting = [s.num_serving + s.num_starting for s in r.samples]
    ax.fill_between(t, 0, serving, step="post", color="#4c72b0", alpha=0.8, label="serving")
    ax.fill_between(t, serving, starting, step="post", color="#dd8452", alpha=0.7,
                    label="starting")  # fmt: skip
    ax.step(t, [s.desired_nodes for s in r.samples], where="post", color="black", lw=0.8,
            label="desired")  # fmt: skip
    if r.bound:
        ax.step([b[0] / 60 for b in r.bound], [b[1] for b in r.bound], where="post",
                color="grey", lw=1.0, ls="--", label="bound (no start-up)")  # fmt: skip
    for e in r.scale_events:
        ax.axvline(e.at_s / 60, color="green" if e.action == "add" else "red", lw=0.3)
    ax.set_xlabel("minutes")
    ax.set_ylabel("pool nodes")
    load = ax.twinx()
    load.plot(t, [s.offered_tokens_per_s / 1000 for s in r.samples], color="#55a868", lw=0.8,
              label="offered load")  # fmt: skip
    load.set_ylabel("offered uncached tokens/s (thousands)")
    lines = ax.get_legend_handles_labels()
    more = load.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    ax.set_title(f"elastic pool: {r.node_hours:.1f} node-hours, attainment "
                 f"{100 * r.attainment:.1f}%, {len(r.scale_events)} scale events")  # fmt: skip
    fig.tight_layout()
    path = folder / "elastic_nodes.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
