"""The simulator's and the planner's scenarios, derived from a deployment file: one description
(``config.DeploymentConfig``) for ``prfaas up``, ``prfaas sim`` and ``prfaas plan``.

``sim_scenario(d)``: every site with its node counts, every link (with the simulation-only
settings a link carries), the policy, the workload and the simulation sections.
``plan_scenario(d)``: the planner's two-cluster view (the first PrfaaS site against the gateway's
PD site, the file's node count). ``workload_lengths(d)``: THE prompt-length distribution of the
file's workload (the trace's prompts when a trace is given, else ``workload.lengths``), cut to
the model's context with a stated warning; the planner, the simulator and the gateway's ``t`` all
read it. ``planned_threshold(d)``: THE ``t`` for a file that does not fix one: the planner's best
``t`` for the file's own roles (its PD site's prefill and decode nodes, not the planner's best
split) over ``workload_lengths(d)``; the gateway starts from it, ``prfaas sim`` runs it and
``prfaas plan --deployment`` prints it. No I/O (``config.py`` reads the file) except the explicit
trace reader (``workload.read_mooncake``) when the file or a flag names a trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prfaas.config import DeploymentConfig, SiteConfig
from prfaas.errors import UsageError
from prfaas.perf.profile_file import is_profile_file

if TYPE_CHECKING:
    # Type-only: the planner and the simulator load when a scenario is derived, not on import.
    from prfaas.analytic import LengthDistribution, Planner, Scenario
    from prfaas.perf import CostModel
    from prfaas.sim import SimScenario

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


@dataclass(frozen=True)
class WorkloadLengths:
    """The file's prompt lengths as every consumer reads them."""

    lengths: LengthDistribution
    """Cut to ``max_prompt_tokens`` already."""
    max_prompt_tokens: int | None
    """The model's context when some prompt had to be cut to it (the simulator cuts a trace's
    prompts to it too), else None."""
    warning: str | None
    """What was cut, for the caller to print (stderr) or log; None when nothing was."""
    source: str
    """``trace FILE`` or ``workload.lengths``."""


def model_context_tokens(d: DeploymentConfig) -> int | None:
    """The longest prompt the file's model takes: from a site's cost model (a preset, or the
    profile file of a real engine's site), else from the model preset named by ``engine.model``;
    None when nothing says (a real engine with no profile: its server enforces its own)."""
    from prfaas.spec import get_model

    for site in d.sites:
        cm = site_cost_model(d, site)
        if cm is not None:
            return cm.model.max_context_tokens
    try:
        return get_model(d.engine.model).max_context_tokens
    except (KeyError, ValueError):
        return None


def workload_lengths(
    d: DeploymentConfig, trace: str | None = None, trace_limit: int | None = None
) -> WorkloadLengths:
    """THE length distribution of ``d``'s workload: the prompt lengths of ``trace`` (a flag), else
    of ``workload.trace``, else ``workload.lengths``. A model whose context is shorter than the
    workload is handled one way everywhere: every prompt longer than the context is cut to it
    (a log-normal is truncated there; a trace's longer prompts are cut), and ``warning`` says so.
    Raises ``UsageError`` for an unreadable trace."""
    from prfaas.analytic import EmpiricalLengths, FixedLengths, TruncatedLogNormal
    from prfaas.analytic.lengths import cut_to_context
    from prfaas.workload import TraceError, read_mooncake

    w = d.workload
    path = trace if trace is not None else w.trace
    limit = trace_limit if trace is not None else w.trace_limit
    dist: LengthDistribution
    if path is not None:
        try:
            values = [r.num_prompt_tokens for r in read_mooncake(path, limit)]
        except TraceError as exc:
            raise UsageError(str(exc)) from None
        if not values:
            raise UsageError(f"trace {path}: no records")
        dist, source = EmpiricalLengths(values, label=f"trace {path}"), f"trace {path}"
    elif w.lengths.kind == "fixed":
        dist, source = FixedLengths(w.lengths.fixed_tokens), "workload.lengths"
    else:
        lc = w.lengths
        try:
            dist = TruncatedLogNormal(lc.mu, lc.sigma, lc.min_tokens, lc.max_tokens)
        except ValueError as exc:
            raise UsageError(f"workload.lengths: {exc}") from None
        source = "workload.lengths"
    context = model_context_tokens(d)
    if context is None:
        return WorkloadLengths(dist, None, None, source)
    cut, warning = cut_to_context(dist, context, f"{source} ({d.engine.model})")
    return WorkloadLengths(cut, context if warning else None, warning, source)


def home_roles(d: DeploymentConfig) -> tuple[int, int, int]:
    """(PrfaaS prefill nodes, the home PD site's prefill nodes, its decode nodes): the file's
    roles, which the planner's ``t`` is planned for."""
    n_p, n_d = _counts(d.home_site)
    n_prfaas = sum(_counts(s)[0] for s in d.sites if s.kind == "prfaas")
    return n_prfaas, n_p, n_d


def plan_scenario(
    d: DeploymentConfig, profiles_ok: bool = False, lengths: LengthDistribution | None = None,
    **overrides: Any,
) -> Scenario:  # fmt: skip
    """The planner's ``analytic.Scenario`` for ``d``: model, both hardware kinds, node counts
    (the home PD site's nodes; the homogeneous baseline gets the file's whole node count), the
    PrfaaS link's bandwidth, the workload's lengths (``workload_lengths`` unless ``lengths`` is
    given) and output tokens, the price ratio when ``prices`` names both kinds; ``overrides``
    (flags) win. ``profiles_ok``: the caller reads a site's profile file itself (``prfaas
    plan``): that side's hardware is left out."""
    from prfaas.analytic import Scenario

    if not profiles_ok:
        _presets_only(d, "the planner")
    home = d.home_site
    remote = [s for s in d.sites if s.kind == "prfaas"]
    w = d.workload
    fields: dict[str, Any] = {
        "model": d.engine.model,
        "n_local": max(2, len(home.nodes)),
        # The baseline a file is compared with has the file's node count, all of them PD.
        "n_homogeneous": max(2, sum(len(s.nodes) for s in d.sites)),
        "output_tokens": w.output_tokens,
        "lengths": lengths if lengths is not None else workload_lengths(d).lengths,
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


def planned_threshold(d: DeploymentConfig, lengths: LengthDistribution | None = None) -> int:
    """THE deployment's ``t`` (the gateway starts from it, the simulator runs it, ``prfaas plan
    --deployment`` prints it): fixed in the file, else the planner's best ``t`` for the file's
    own roles (``home_roles``) over ``lengths`` (default ``workload_lengths(d)``: the trace's
    when the file names one). A real engine needs both sites' profile files for that (else a
    fixed default); a file with nowhere to offload to never offloads."""
    if d.policy.threshold_tokens is not None:
        return d.policy.threshold_tokens
    if d.engine.kind != "timed" and deployment_cost_models(d)[1] is None:
        return DEFAULT_TORCH_THRESHOLD_TOKENS
    n_prfaas, n_p, n_d = home_roles(d)
    if n_prfaas == 0:
        return NO_OFFLOAD_TOKENS
    if n_d == 0:
        raise UsageError(f"site {d.home_site.name}: no decode node")
    if lengths is None:
        lengths = workload_lengths(d).lengths
    planner = planner_for(d, lengths=lengths, n_local=max(2, n_p + n_d))
    return int(planner.plan(n_p=n_p).prfaas.threshold_tokens or 0)


def planner_for(d: DeploymentConfig, **overrides: Any) -> Planner:
    """The planner of ``d``'s two clusters, each side's timing from its hardware preset or
    profile file; ``overrides`` go to ``plan_scenario``."""
    from prfaas.analytic import Planner
    from prfaas.perf import cost_model_for_hardware

    remote = next((s for s in d.sites if s.kind == "prfaas"), None)
    local = cost_model_for_hardware(d.engine.model, d.home_site.hardware)
    # No PrfaaS site: nothing offloads and the remote side is never priced; the home's model
    # stands in (the planner's preset fallback refuses a profiled model's own name).
    return Planner(
        plan_scenario(d, profiles_ok=True, **overrides),
        remote=local
        if remote is None
        else cost_model_for_hardware(d.engine.model, remote.hardware),
        local=local,
    )


def _shared_cores(d: DeploymentConfig, site: str) -> dict[str, Any]:
    """A site whose node processes are pinned to the same cores shares them (``engine.cpus``, a
    vLLM site's ``cpu_bind``), with the gateway where ``gateway.cpus`` lies within them (one
    overlapping two sites' cores, or only part of one, is not modelled: a core of its own).
    Timed nodes sleep their modelled times rather than compute, so their cores are never the
    limit."""
    cores = d.cores_of_site(site)
    eng = d.engine_for(site)
    if cores is None or eng.kind == "timed":
        return {}
    # A torch node computes on its ``threads``; a vLLM server binds its OpenMP threads to all
    # its cores.
    threads = eng.threads if eng.kind == "torch" else len(cores)
    gateway = d.gateway_cores()
    hosts = gateway is not None and gateway <= cores and _first_host(d, gateway) == site
    # `prfaas up` runs one vLLM server per vLLM site: its prefill and decode node are one
    # engine, whose steps carry both (sim.processor, mixed steps).
    mixed = _one_engine(d, next(s for s in d.sites if s.name == site))
    return {
        "shared_cores": len(cores), "threads_per_node": threads, "hosts_gateway": hosts,
        "mixed_steps": mixed,
    }  # fmt: skip


def _one_engine(d: DeploymentConfig, site: SiteConfig) -> bool:
    """``prfaas up`` runs one vLLM server per vLLM site: its one prefill and one decode node
    are one engine, with one KV cache."""
    return d.engine_for(site.name).kind == "vllm" and _counts(site) == (1, 1)


def _first_host(d: DeploymentConfig, gateway: frozenset[int]) -> str | None:
    """The first site whose pinned cores hold all of ``gateway``'s (two sites on the same
    cores: the gateway is charged once, to the first)."""
    for s in d.sites:
        cores = d.cores_of_site(s.name)
        if cores is not None and d.engine_for(s.name).kind != "timed" and gateway <= cores:
            return s.name
    return None


def sim_scenario(
    d: DeploymentConfig, trace: str | None = None, trace_limit: int | None = None
) -> SimScenario:
    """The simulator's ``SimScenario`` for ``d`` (validate it with ``.validate()``); ``trace``
    (a flag) replaces the file's workload with a trace, whose prompt lengths then plan ``t``
    (``workload_lengths``; its warning is the caller's to print)."""
    from prfaas.sim import LengthConfig, SimScenario, SimSite
    from prfaas.workload import ArrivalSpec

    sim, w = d.simulation, d.workload
    cache_bytes = sim.cache_bytes_per_node
    sites = tuple(
        SimSite(
            s.name, s.kind, s.hardware, *_counts(s), cache_bytes_per_node=cache_bytes,
            decode_pads_batch=sim.decode_pads_batch_for(d.engine_for(s.name).kind),
            decode_max_batch=sim.decode_max_batch_for(d.engine_for(s.name).kind),
            lookup_at_start=d.engine_for(s.name).kind == "vllm",
            local_kv_in_place=_one_engine(d, s),
            **_shared_cores(d, s.name),
        )
        for s in d.sites
    )  # fmt: skip
    links = tuple(d.links)  # the file's links are the simulator's type (core.link_config)
    a = w.arrival
    rate = a.rate_rps if a.rate_rps is not None else ArrivalSpec().rate_rps
    lengths = w.lengths
    wl = workload_lengths(d, trace, trace_limit)
    return SimScenario(
        sites=sites,
        links=links,
        model=d.engine.model,
        policy=d.policy.router,
        threshold_tokens=planned_threshold(d, wl.lengths),
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
        trace=trace if trace is not None else w.trace,
        trace_limit=trace_limit if trace is not None else w.trace_limit,
        max_prompt_tokens=wl.max_prompt_tokens,
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
        prefill_token_budget=sim.prefill_budget_for(d.engine_for(d.home_site.name).kind),
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
