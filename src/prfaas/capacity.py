"""THE capacity of a deployment file, defined once: the highest constant open-loop arrival rate at
which no stage's backlog grows and the file's decode SLO holds.

One rule computes it, the simulator's (``sim.maxrate.find_max_rate``), over the file's own
deployment as ``prfaas sim FILE`` runs it: its roles, the cores its nodes share (``engine.cpus``,
a vLLM site's ``cpu_bind``), the engine kind's prefill batching (``simulation.
prefill_token_budget``, default per kind), the measured plumbing terms of its profiles
(``CostModel.plumbing``, charged by the simulator where the work happens), the workload's lengths
(the trace's, rescaled to each trial rate, when a trace is given) and the decode SLO.
``prfaas plan --deployment`` and ``prfaas sim --find-max-rate`` both print this figure, so they
agree by construction on the same file; ``prfaas bench --find-max-rate`` measures it live by the
same rule (``serve/loadgen/maxrate.py``).

Beside it stands the paper's closed form, Eqs. 1-8 with exact service (``lambda_max_exact``),
and ``left_out`` says what those equations leave out for this file, where it applies. The drain
rate of an all-at-once burst is another figure ("burst throughput") and is never called capacity.

Pure apart from the simulator's explicit trace reader; imports the simulator and the planner only
when asked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prfaas.perf.plumbing import PLUMBING_TERMS

if TYPE_CHECKING:
    from prfaas.config import DeploymentConfig
    from prfaas.sim import MaxRateResult, SimScenario

DEFAULT_TRIAL_REQUESTS = 12000
"""Requests per trial when ``prfaas plan`` searches (what tests/unit/sim/test_sim_max_rate.py
checks against Eqs. 1-8: fewer make a long prefill in service look like backlog); ``sim
--find-max-rate`` takes 20,000 by default."""


@dataclass(frozen=True, slots=True)
class PlumbingBound:
    """A ceiling a measured plumbing term alone puts on the rate (``CostModel.plumbing``)."""

    what: str
    rate_rps: float


@dataclass(frozen=True, slots=True)
class Capacity:
    capacity_rps: float
    """The one capacity: the simulator's rule, capped by any plumbing ceiling lower than it."""
    simulated_rps: float
    """The simulator's rule alone (it charges whatever plumbing terms it models itself)."""
    bounds: tuple[PlumbingBound, ...]
    lambda_max_exact: float | None
    """Eqs. 1-8 with exact service for the file's roles and ``t`` (None: several PD sites)."""
    left_out: tuple[str, ...]
    """What Eqs. 1-8 leave out for this file (empty: nothing they do not model applies)."""
    trials: int
    num_requests: int
    workload: str
    """``synthetic`` or ``trace``."""

    def as_dict(self) -> dict[str, object]:
        return {
            "capacity_rps": self.capacity_rps,
            "simulated_rps": self.simulated_rps,
            "plumbing_bounds_rps": {b.what: b.rate_rps for b in self.bounds},
            "definition": "highest constant open-loop arrival rate at which no stage's backlog "
            "grows and the decode SLO holds (simulated, sim.maxrate rule)",
            "lambda_max_exact_eqs_1_8": self.lambda_max_exact,
            "ratio_to_eqs": (
                self.capacity_rps / self.lambda_max_exact if self.lambda_max_exact else None
            ),
            "eqs_1_8_leave_out": list(self.left_out),
            "trials": self.trials,
            "num_requests_per_trial": self.num_requests,
            "workload": self.workload,
        }


def left_out_by_eqs(d: DeploymentConfig, sc: SimScenario) -> tuple[str, ...]:
    """What the paper's Eqs. 1-8 leave out for ``d`` and make its figure differ from the
    simulator's: shared cores, a prefill batching other than the planner's, measured plumbing,
    a trace's arrival order and prefix reuse."""
    from prfaas.scenarios import site_cost_model

    out: list[str] = []
    for site in sc.sites:
        if site.shared_cores is not None:
            demand = (site.num_prefill + site.num_decode) * site.threads_per_node
            if site.mixed_steps:
                out.append(
                    f"mixed steps: site {site.name}'s prefill and decode node are one engine "
                    f"on {site.shared_cores} core(s), each step a prefill chunk and the decode "
                    "batch; Eqs. 3-5 give each node its own machine"
                )
            elif demand > site.shared_cores:
                out.append(
                    f"shared cores: site {site.name}'s {site.num_prefill + site.num_decode} "
                    f"nodes ({site.threads_per_node} thread(s) each) run on {site.shared_cores} "
                    "core(s); Eqs. 3-5 give each node its own machine"
                )
        if site.decode_max_batch is not None and site.num_decode:
            out.append(
                f"decode batch: site {site.name}'s engine holds up to {site.decode_max_batch} "
                "requests a step whatever the step takes (simulation.decode_max_batch); Eqs. 5-6 "
                "size it by the TPOT SLO (BS_max)"
            )
        if site.hosts_gateway:
            out.append(
                f"the gateway on site {site.name}'s cores (gateway.cpus): its CPU, and the "
                "sharing overhead of time-sharing with it, is taken from that site's nodes; "
                "Eqs. 3-5 charge the gateway nothing"
            )
    if sc.prefill_token_budget < 32768:
        out.append(
            f"prefill batching: batches of at most {sc.prefill_token_budget} uncached tokens "
            "(the engine's); Eqs. 3-4 serve requests back to back with no batching"
        )
    for cfg in d.sites:
        cm = site_cost_model(d, cfg)
        if cm is None:
            continue
        measured = [t for t in PLUMBING_TERMS if getattr(cm.plumbing, t) > 0]
        if measured:
            out.append(
                f"plumbing: site {cfg.name}'s profile measures {', '.join(measured)}; Eqs. 3-5 "
                "time the forward passes only"
            )
    padded = [s.name for s in sc.sites if s.kind == "pd" and s.decode_pads_batch]
    if padded:
        out.append(
            f"decode padding: site(s) {', '.join(padded)} step a batch padded to its longest "
            "context (engine.torch); Eq. 5 prices a step at the mean context"
        )
    if sc.trace is not None:
        out.append("trace: its arrival order and prefix reuse (Eqs. 1-8 see lengths only)")
    if sc.output_tokens <= 100:  # beyond, one step in a hundred or fewer: not worth a line
        out.append(
            f"decode steps: Eq. 5 counts {sc.output_tokens} steps per request; the engines step "
            f"{sc.output_tokens - 1} (the prefill samples the first token)"
        )
    if sc.slo_tpot_s and any(s.shared_cores is not None for s in sc.sites):
        out.append("decode SLO under sharing: a slowed decode step must still meet slo_tpot_s")
    return tuple(out)


def plumbing_bounds(d: DeploymentConfig, sc: SimScenario) -> tuple[PlumbingBound, ...]:
    """Ceilings from the measured plumbing terms of the home PD site's cost model, each a
    necessary condition (it counts that one CPU cost and nothing else on the same core):
    - the gateway, one process on at most one core: ``rate x (per request + per output token x
      L_out) <= 1``;
    - the decode nodes: ``rate x (per request + per KV byte x E[S_kv] + per output token x L_out)
      <= N_d`` (each node's own CPU, on top of its batched steps; ``decode_per_step_s`` and
      ``gateway_per_step_s`` are left out, their share per request depends on the batch: the
      simulator charges them per step). Where the site's prefill and decode node are one engine
      (``SimSite.local_kv_in_place``) only an offloaded request installs: the install terms
      are weighted by the prompts over ``t`` (none under ``local_only``; prefix hits not
      counted);
    - every prefill node pays its costs beyond its curve: ``rate x (per request + per token x
      E[L] + in-service excess x T(E[L])) <= N_prefill`` (every prompt token counted: no prefix
      hits assumed; the excess on the mean prompt's passes, the curve being near-linear).
    Empty when nothing is measured (all 0.0)."""
    from prfaas.analytic.lengths import mean
    from prfaas.scenarios import home_roles, site_cost_model, workload_lengths

    cm = site_cost_model(d, d.home_site)
    if cm is None:
        return ()
    p = cm.plumbing
    out_tokens = sc.output_tokens
    n_prfaas, n_p, n_d = home_roles(d)
    lengths = workload_lengths(d).lengths
    mean_tokens = mean(lengths)
    kv = float(cm.kv_bytes(max(1, round(mean_tokens))))
    installs = p.decode_per_request_s + p.decode_per_kv_byte_s * kv
    home = next(s for s in sc.sites if s.name == d.home_site.name)
    if home.local_kv_in_place:

        def install_s(n: float) -> float:
            return p.decode_per_request_s + p.decode_per_kv_byte_s * cm.kv_bytes(max(1, round(n)))

        installs = (
            0.0
            if sc.policy == "local_only"
            else lengths.partial_expect(install_s, sc.threshold_tokens, lengths.max_tokens)
        )
    candidates = (
        ("gateway CPU (one process)", p.gateway_per_request_s
         + p.gateway_per_output_token_s * out_tokens, 1),
        ("decode nodes' CPU beyond their steps",
         installs + p.decode_per_output_token_s * out_tokens, n_d),
        ("prefill nodes' CPU beyond their curve",
         p.prefill_overhead_s(round(mean_tokens), cm.prefill_s(max(1, round(mean_tokens)))),
         n_p + n_prfaas),
    )  # fmt: skip
    return tuple(
        PlumbingBound(what, cores / seconds) for what, seconds, cores in candidates if seconds > 0
    )


def deployment_capacity(
    d: DeploymentConfig,
    sc: SimScenario,
    lambda_max_exact: float | None,
    num_requests: int = DEFAULT_TRIAL_REQUESTS,
) -> Capacity:
    """The capacity of ``d`` as ``prfaas sim`` simulates it (``sc``: ``scenarios.sim_scenario``
    with any flags applied), searched from the planner's figure (or the file's rate)."""
    res = search(sc, lambda_max_exact, num_requests)
    bounds = plumbing_bounds(d, sc)
    capacity = min([res.max_rate_rps, *(b.rate_rps for b in bounds)])
    left_out = left_out_by_eqs(d, sc) + tuple(
        f"plumbing ceiling: {b.what} allows {b.rate_rps:.3f} req/s" for b in bounds
        if b.rate_rps <= res.max_rate_rps
    )  # fmt: skip
    return Capacity(
        capacity, res.max_rate_rps, bounds, lambda_max_exact, left_out, len(res.trials),
        res.rule.num_requests, "trace" if sc.trace is not None else "synthetic",
    )  # fmt: skip


def search(
    sc: SimScenario, start_rps: float | None, num_requests: int = DEFAULT_TRIAL_REQUESTS
) -> MaxRateResult:
    """``find_max_rate`` from ``start_rps`` (else the trace's own pace, else the scenario's rate),
    with stratified lengths (common random numbers across rates)."""
    from prfaas.sim import MaxRateRule, find_max_rate
    from prfaas.sim.maxrate import trace_rate

    rule = MaxRateRule(num_requests=num_requests)
    start = start_rps or sc.arrival.rate_rps
    if sc.trace is not None and not start_rps:
        start = trace_rate(sc, rule.num_requests).rate_rps * sc.rate_scale
    return find_max_rate(replace(sc, stratified=True), start, rule)
