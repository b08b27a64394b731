"""The simulator's and the planner's scenarios, derived from a deployment file: one description
(``config.DeploymentConfig``) for ``prfaas up``, ``prfaas sim`` and ``prfaas plan``.

``sim_scenario(d)``: every site with its node counts, every link (with the simulation-only
settings a link carries), the policy, the workload and the simulation sections.
``plan_scenario(d)``: the planner's two-cluster view (the first PrfaaS site against the gateway's
PD site). ``planned_threshold(d)``: the planner's ``t`` for a file that does not fix one, the same
figure the live gateway starts from. No I/O (``config.py`` reads the file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prfaas.config import DeploymentConfig, SiteConfig
from prfaas.errors import UsageError
from prfaas.perf.profile_file import is_profile_file

if TYPE_CHECKING:
    # Type-only: the planner and the simulator load when a scenario is derived, not on import.
    from prfaas.analytic import Planner, Scenario
    from prfaas.perf import CostModel
    from prfaas.sim import SimScenario

MIB = 1 << 20
NO_OFFLOAD_TOKENS = 2**31 - 1
"""The threshold of a deployment with nowhere to offload to."""
DEFAULT_TORCH_THRESHOLD_TOKENS = 128
"""Without a cost model (real engines, no profile), offload prompts longer than this."""


def _counts(site: SiteConfig) -> tuple[int, int]:
    roles = [n.role for n in site.nodes]
    return roles.count("prefill"), roles.count("decode")


def _presets_only(d: DeploymentConfig, what: str) -> None:
    for site in d.sites:
        if is_profile_file(site.hardware):
            raise UsageError(
                f"site {site.name}: hardware {site.hardware}: {what} models hardware presets "
                "only for now (profile files are read by the cost model, not yet by this path)"
            )


def plan_scenario(d: DeploymentConfig, profiles_ok: bool = False, **overrides: Any) -> Scenario:
    """The planner's ``analytic.Scenario`` for ``d``: model, both hardware kinds, node counts,
    the PrfaaS link's bandwidth, the workload's lengths and output tokens, the price ratio when
    ``prices`` names both kinds; ``overrides`` (flags) win. ``profiles_ok``: the caller reads a
    site's profile file itself (``prfaas plan``): that side's hardware is left out."""
    from prfaas.analytic import Scenario, TruncatedLogNormal

    if not profiles_ok:
        _presets_only(d, "the planner")
    home = d.home_site
    remote = [s for s in d.sites if s.kind == "prfaas"]
    w = d.workload
    if w.lengths.kind != "lognormal":
        raise UsageError("workload.lengths: the planner takes log-normal lengths (or --trace)")
    fields: dict[str, Any] = {
        "model": d.engine.model,
        "n_local": max(2, len(home.nodes)),
        "output_tokens": w.output_tokens,
        "lengths": TruncatedLogNormal(
            w.lengths.mu, w.lengths.sigma, w.lengths.min_tokens, w.lengths.max_tokens
        ),
    }
    if not is_profile_file(home.hardware):
        fields["local_hardware"] = home.hardware
    if remote:
        link = d.link_to_home(remote[0].name)
        if not is_profile_file(remote[0].hardware):
            fields["prfaas_hardware"] = remote[0].hardware
        fields["n_prfaas"] = sum(len(s.nodes) for s in remote)
        if link is not None:
            fields["link_gbps"] = link.gbps
        prices = d.prices
        if remote[0].hardware in prices and home.hardware in prices:
            fields["price_ratio"] = prices[remote[0].hardware] / prices[home.hardware]
    fields.update(overrides)
    return Scenario(**fields)


def site_cost_model(d: DeploymentConfig, site: SiteConfig) -> CostModel | None:
    """A site's timing: its hardware preset for emulated (``timed``) nodes, or its profile file
    for any engine (a torch or vLLM site measured with ``prfaas profile``); None for a real engine
    on a preset: nothing measured prices it."""
    from prfaas.perf import cost_model_for_hardware

    engine = d.engine_for(site.name)
    if engine.kind == "timed" or is_profile_file(site.hardware):
        return cost_model_for_hardware(engine.model, site.hardware)
    return None


def deployment_cost_models(d: DeploymentConfig) -> tuple[CostModel | None, CostModel | None]:
    """(PrfaaS, local) cost models for the router, the tuner, the rebalancer and the planner's
    ``t``: both or neither (half a pair prices nothing: the tuner weighs one side against the
    other); the PrfaaS one is None too without a PrfaaS site."""
    local = site_cost_model(d, d.home_site)
    remote_site = next((s for s in d.sites if s.kind == "prfaas"), None)
    if remote_site is None:
        return None, local
    remote = site_cost_model(d, remote_site)
    if remote is None or local is None:
        return None, None
    return remote, local


def planned_threshold(d: DeploymentConfig) -> int:
    """The deployment's ``t``: fixed in the file, else the planner's for these node counts (a
    real engine needs both sites' profile files for that; else a fixed default)."""
    if d.policy.threshold_tokens is not None:
        return d.policy.threshold_tokens
    if d.engine.kind != "timed" and deployment_cost_models(d)[1] is None:
        return DEFAULT_TORCH_THRESHOLD_TOKENS
    if not any(s.kind == "prfaas" for s in d.sites):
        return NO_OFFLOAD_TOKENS
    return int(planner_for(d).plan().prfaas.threshold_tokens or 0)


def planner_for(d: DeploymentConfig, **overrides: Any) -> Planner:
    """The planner of ``d``'s two clusters, each side's timing from its hardware preset or
    profile file; ``overrides`` go to ``plan_scenario``."""
    from prfaas.analytic import Planner
    from prfaas.perf import cost_model_for_hardware

    remote = next((s for s in d.sites if s.kind == "prfaas"), None)
    local = cost_model_for_hardware(d.engine.model, d.home_site.hardware)
    return Planner(
        plan_scenario(d, profiles_ok=True, **overrides),
        remote=None if remote is None else cost_model_for_hardware(d.engine.model, remote.hardware),
        local=local,
    )


def _shared_cores(d: DeploymentConfig, site: str) -> dict[str, int]:
    """A site whose node processes are pinned to the same cores shares them (``engine.cpus``, a
    vLLM site's ``cpu_bind``). Timed nodes sleep their modelled times rather than compute, so
    their cores are never the limit."""
    cores = d.cores_of_site(site)
    eng = d.engine_for(site)
    if cores is None or eng.kind == "timed":
        return {}
    # A torch node computes on its ``threads``; a vLLM server binds its OpenMP threads to all
    # its cores.
    threads = eng.threads if eng.kind == "torch" else len(cores)
    return {"shared_cores": len(cores), "threads_per_node": threads}


def sim_scenario(d: DeploymentConfig) -> SimScenario:
    """The simulator's ``SimScenario`` for ``d`` (validate it with ``.validate()``)."""
    from prfaas.sim import LengthConfig, LinkConfig, SimScenario
    from prfaas.sim import SiteConfig as SimSite
    from prfaas.workload import ArrivalSpec

    sim, w = d.simulation, d.workload
    cache_bytes = sim.cache_bytes_per_node
    sites = tuple(
        SimSite(
            s.name, s.kind, s.hardware, *_counts(s), cache_bytes_per_node=cache_bytes,
            **_shared_cores(d, s.name),
        )
        for s in d.sites
    )  # fmt: skip
    links = tuple(
        LinkConfig(
            lk.src, lk.dst, lk.gbps, lk.rtt_ms / 1000, lk.connections, lk.window_mib * MIB,
            tuple((float(t), float(g)) for t, g in lk.schedule),
        )
        for lk in d.links
    )  # fmt: skip
    a = w.arrival
    rate = a.rate_rps if a.rate_rps is not None else ArrivalSpec().rate_rps
    lengths = w.lengths
    return SimScenario(
        sites=sites,
        links=links,
        model=d.engine.model,
        policy=d.policy.router,
        threshold_tokens=planned_threshold(d),
        arrival=ArrivalSpec(a.kind, rate, a.cv, a.on_s, a.on_fraction),
        lengths=LengthConfig(
            lengths.kind,
            lengths.mu,
            lengths.sigma,
            lengths.min_tokens,
            lengths.max_tokens,
            lengths.fixed_tokens,
        ),
        output_tokens=w.output_tokens,
        trace=w.trace,
        trace_limit=w.trace_limit,
        rate_scale=w.rate_scale,
        duration_s=w.duration_s,
        drain_s=sim.drain_s,
        warmup_s=w.warmup_s,
        seed=w.seed,
        prefix_cache=sim.prefix_cache,
        block_tokens=d.engine.block_tokens,
        checkpoint_every_blocks=d.engine.checkpoint_every_blocks,
        slo_ttft_s=sim.slo_ttft_s,
        slo_tpot_s=sim.slo_tpot_s,
        local_fabric_gbps=sim.local_fabric_gbps,
        prefill_token_budget=sim.prefill_token_budget,
        decode_kv_fraction=sim.decode_kv_fraction,
        tune=sim.tune,
        rebalance=d.policy.rebalance,
        tune_min_samples=d.policy.tune_min_samples,
        role_switch_s=sim.role_switch_s,
        control_interval_s=d.policy.control_interval_s,
        sample_interval_s=sim.sample_interval_s,
        plumbing_off=sim.plumbing.off(),
    )


def rate_was_given(d: DeploymentConfig) -> bool:
    """The file fixes the arrival rate (else the caller picks one, e.g. 80% of capacity)."""
    return d.workload.arrival.rate_rps is not None
