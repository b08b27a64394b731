"""``prfaas sim POOL.yaml TENANT.yaml...``: simulate a shared PrfaaS pool and its tenants from the
very files ``prfaas up`` runs (``docs/pool.md``).

Each tenant file gives the tenant's arrivals and lengths (``workload:``), its local prefill nodes
and their hardware (its PD site), its model, its own link and TTFT target and tuner (``pool:``);
the pool file gives the groups (model, hardware, nodes), the egress and the tenants' weights,
floors and caps. Each tenant routes with its file's ``policy.router`` and the cost models the
live gateway gives it (``scenarios.deployment_cost_models`` of the tenant with its pool site).
The plumbing terms charged (``sim.pool_sim``): a tenant's processes by its
file's ``simulation.plumbing``, the pool's nodes by the pool file's (no section: all on).
``build_pool_scenario`` is also what ``bench/pool_coordination.py`` runs.
Bad input: one line naming the file and field, exit 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prfaas.config import EngineConfig
from prfaas.errors import UsageError
from prfaas.perf import ProfileFileError, cost_model_for_hardware
from prfaas.pool.site import with_pool_site
from prfaas.pool_file import load_pool, load_tenant, pool_shape
from prfaas.scenarios import deployment_cost_models
from prfaas.sim.pool_scenario import PoolSimGroup, PoolSimScenario, PoolSimTenant, TunerKind
from prfaas.workload import ArrivalSpec, FixedLengths, TruncatedLogNormal

_CHECKPOINT_EVERY_BLOCKS: int = EngineConfig.model_fields["checkpoint_every_blocks"].default
"""A pool node's (``pool.nodes_file`` leaves its engine's at the default)."""


def build_pool_scenario(
    pool_path: Path,
    tenant_paths: list[Path],
    tuner: TunerKind | None = None,
    rate_factors: dict[str, float] | None = None,
    ttft_target_s: float | None = None,
    duration_s: float | None = None,
) -> PoolSimScenario:
    pool = load_pool(pool_path)
    if not tenant_paths:
        raise UsageError(f"{pool_path}: give the tenant files to simulate after the pool file")
    groups = []
    for i, g in enumerate(pool.groups):
        try:
            cost = cost_model_for_hardware(g.model, g.hardware)
        except (KeyError, ProfileFileError) as exc:
            raise UsageError(
                f"{pool_path}: groups.{i}: the simulator needs a model preset and a hardware "
                f"preset or profile: {exc}"
            ) from None
        off = pool.simulation.plumbing.off()  # the pool file's own switches (none: all on)
        groups.append(
            PoolSimGroup(
                g.name, g.model, len(g.node_names), cost, off,
                node_names=tuple(g.node_names),
                # A store per node process, as the live group runs them (one shared process, or
                # one per node), checkpointing as its nodes' engine does (``pool.nodes_file``).
                per_node_stores=g.per_node_processes,
                checkpoint_every_blocks=_CHECKPOINT_EVERY_BLOCKS,
            )
        )  # fmt: skip
    tenants = []
    seen: set[str] = set()
    warmup = 0.0
    longest = 0.0
    for path in tenant_paths:
        cfg = load_tenant(path, pool, pool_path)
        ref = cfg.pool
        assert ref is not None
        if ref.tenant in seen:
            raise UsageError(f"{path}: pool.tenant: {ref.tenant!r} is given by two tenant files")
        seen.add(ref.tenant)
        wl = cfg.workload
        trace, hashes = (
            _trace(path, wl.trace, wl.trace_limit, wl.rate_scale, pool.units.block_tokens)
            if wl.trace
            else (None, None)
        )
        if trace is None and wl.arrival.rate_rps is None:
            raise UsageError(f"{path}: workload.arrival.rate_rps: a tenant needs its own rate")
        rate = (wl.arrival.rate_rps or 1.0) * (rate_factors or {}).get(ref.tenant, 1.0)
        a = wl.arrival
        arrival = ArrivalSpec(a.kind, rate, a.cv, a.on_s, a.on_fraction)
        ln = wl.lengths
        lengths = (
            FixedLengths(ln.fixed_tokens)
            if ln.kind == "fixed"
            else TruncatedLogNormal(ln.mu, ln.sigma, ln.min_tokens, ln.max_tokens)
        )
        home = cfg.home_site
        # The router's cost models as the live gateway gets them: the tenant with the pool as
        # its PrfaaS site (``with_pool_site``: an H200 of its model).
        remote, local = deployment_cost_models(with_pool_site(cfg))
        num_prefill = sum(1 for n in home.nodes if n.role == "prefill")
        try:
            local_cost = cost_model_for_hardware(cfg.engine.model, home.hardware)
        except (KeyError, ProfileFileError) as exc:
            raise UsageError(f"{path}: sites: {home.name}: hardware: {exc}") from None
        dur = wl.duration_s if duration_s is None else duration_s
        longest = max(longest, dur)
        warmup = max(warmup, wl.warmup_s)
        tenants.append(
            PoolSimTenant(
                name=ref.tenant,
                model=cfg.engine.model,
                arrival=arrival,
                lengths=lengths,
                num_local_prefill=num_prefill,
                local_cost=local_cost,
                link_bytes_per_s=ref.link.gbps * 1e9 / 8,
                rtt_s=ref.link.rtt_ms / 1000,
                threshold_tokens=cfg.policy.threshold_tokens,
                tuner=ref.tuner if tuner is None else tuner,
                ttft_target_s=ref.ttft_target_s if ttft_target_s is None else ttft_target_s,
                stop_s=dur,
                seed=wl.seed,
                trace=trace,
                trace_block_hashes=hashes,
                plumbing_off=cfg.simulation.plumbing.off(),
                home_site=home.name,
                router=cfg.policy.router,
                router_remote=remote,
                router_local=local,
            )
        )
    if warmup >= longest:
        raise UsageError(
            f"workload.warmup_s ({warmup:g} s, the largest of the tenants') is not under the "
            f"run's {longest:g} s of arrivals: nothing would be measured"
        )
    return PoolSimScenario(
        shape=pool_shape(pool),
        groups=tuple(groups),
        tenants=tuple(tenants),
        duration_s=longest,
        measure_from_s=warmup,
        block_tokens=pool.units.block_tokens,
        share_prefixes=pool.share_prefixes,
        prefix_shares=pool.prefix_shares(),  # the shares the live nodes' quotas come from
    )


def _trace(
    path: Path, trace: str, limit: int | None, rate_scale: float, block_tokens: int
) -> tuple[tuple[tuple[float, int], ...], tuple[tuple[int, ...], ...] | None]:
    """The trace's (arrival_s, prompt tokens) from 0, and its prompts' block hashes when they
    are the pool's blocks (a Mooncake trace's ``hash_ids`` name 512-token blocks; another
    ``units.block_tokens``: None, no prefix hits at the pool)."""
    from prfaas.workload import TraceError, read_mooncake
    from prfaas.workload.mooncake import TRACE_BLOCK_TOKENS

    file = Path(trace)  # as given (like a deployment file's), else beside the tenant file
    if not file.is_absolute() and not file.exists():
        file = path.parent / trace
    try:
        records = tuple(read_mooncake(file, limit))
    except TraceError as exc:
        raise UsageError(f"{path}: workload.trace: {exc}") from None
    if not records:
        raise UsageError(f"{path}: workload.trace: {file} has no records")
    t0 = records[0].arrival_s / rate_scale
    rows = tuple((r.arrival_s / rate_scale - t0, r.num_prompt_tokens) for r in records)
    if block_tokens != TRACE_BLOCK_TOKENS:
        return rows, None
    return rows, tuple(r.block_hashes for r in records)


_NOT_FOR_POOLS = (
    "config", "policy", "arrival", "rate", "cv", "on_s", "on_fraction", "trace", "trace_limit",
    "rate_scale", "seed", "threshold", "n_p", "n_d", "link_gbps", "rtt_ms", "connections",
    "window_mib", "link_schedule", "rebalance", "no_tune", "no_cache", "output_tokens", "mu",
    "sigma", "warmup", "find_max_rate", "timeseries", "plot", "requests_csv", "perfetto",
)  # fmt: skip


def run_pool(args: argparse.Namespace) -> int:
    from prfaas.sim.pool_report import pool_summary
    from prfaas.sim.pool_sim import PoolSimulator

    given = [f"--{name.replace('_', '-')}" for name in _NOT_FOR_POOLS
             if getattr(args, name, None) not in (None, False)]  # fmt: skip
    if given:
        raise UsageError(
            f"{given[0]} does not apply to a pool simulation (its tenants' files set it); "
            "a pool run takes --duration and --json"
        )
    try:
        sc = build_pool_scenario(args.file, list(args.tenant_files), duration_s=args.duration)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    sim = PoolSimulator(sc)
    sim.run()
    out = pool_summary(sim)
    if args.json:
        print(json.dumps(out))
    else:
        _print_human(out)
    return 0


def _print_human(out: dict[str, Any]) -> None:
    pool = out["pool"]
    groups = ", ".join(
        f"{g} ({v['model']}, {v['num_nodes']} nodes) {v['utilisation']:.2f}"
        for g, v in pool["groups"].items()
    )
    print(
        f"pool: {groups}; egress {pool['egress_gbps']:.0f} Gbps at {pool['egress_utilisation']:.2f}"
    )
    for name, t in out["tenants"].items():
        r, ttft = t["requests"], t["ttft_s"]
        compute = ", ".join(f"{g} {v:.3f}" for g, v in t["compute_share"].items())
        print(
            f"tenant {name} (weight {t['weight']}, {t['tuner']}): {r['arrived']} arrived, "
            f"{r['completed']} completed, {r['offloaded']} offloaded, refused {r['refused']}; "
            f"TTFT p50 {ttft['p50']:.2f} p90 {ttft['p90']:.2f} s (target "
            f"{t['ttft_target_s']} s); compute share {compute}, egress share "
            f"{t['egress_share']:.3f}; t = {t['threshold_tokens']}"
        )
