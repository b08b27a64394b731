"""``SimScenario``: everything one simulation run needs, as frozen dataclasses, and the paper's
three case-study deployments (``paper_deployment``).

Validation names the bad value and raises ``ScenarioError`` (the CLI turns it into exit 2): no
decode node at a PD site, a PD site with no way to prefill, a remote site in use over a 0 Gbps
link, a negative rate. Pure: no I/O (YAML is read by the CLI).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from prfaas.core.link_config import LinkConfig as LinkConfig  # the deployment file's type too
from prfaas.workload.arrivals import ArrivalSpec

DEPLOYMENTS = ("paper-prfaas", "paper-homogeneous", "paper-naive")


class ScenarioError(ValueError):
    """An impossible or malformed scenario."""


@dataclass(frozen=True, slots=True)
class SimSite:
    """The simulator's view of a site, not a second description of one: node counts and what
    the simulator charges them with. The one description is the deployment file's site
    (``config.SiteConfig``: its nodes by name and port, its engine); this view is derived from it
    in one place, ``scenarios.sim_scenario`` (counts from the nodes, ``cache_bytes_per_node``
    from ``simulation:``, the shared cores from the site's ``engine.cpus``), so the pure
    simulator needs no pydantic. A link needs no view: both use ``core.link_config``."""

    name: str
    kind: str
    """``pd`` (prefill + decode nodes, serves clients) or ``prfaas`` (prefill only)."""
    hardware: str
    num_prefill: int
    num_decode: int = 0
    cache_bytes_per_node: float = 1e12
    """Prefix-cache pool per node (host DRAM, shared per site): 1 TB per 8-GPU node (ASSUMPTION)."""
    shared_cores: int | None = None
    """The site's nodes run together on this many cores (``SharedCores``); None: each node on
    its own hardware, as its timings were measured."""
    threads_per_node: int = 1
    """Cores one busy node computes on (with ``shared_cores``)."""
    hosts_gateway: bool = False
    """The gateway process is pinned to these shared cores (``gateway.cpus`` within the site's
    ``engine.cpus``): it takes its share of them (``SharedCores``); else it has a core of its
    own."""
    mixed_steps: bool = False
    """The site's one prefill and one decode node are one engine that runs both in each step
    (a vLLM server: ``processor.SharedCores``, mixed steps); needs ``shared_cores``."""
    local_kv_in_place: bool = False
    """The site's one prefill and one decode node are one engine with one KV cache (a vLLM
    server): a local prefill's KV is already where its decode runs, so only a request whose KV
    came over a link is installed (``decode_per_request_s``, ``decode_per_kv_byte_s``); False:
    every request is (prfaas's own nodes hand a local prefill's KV from the prefill node to the
    decode node)."""
    lookup_at_start: bool = False
    """The site's engine looks its prefix cache up when it schedules a prefill (a vLLM server),
    so a request finds what was stored while it queued; False: it uses what it found when routed
    (prfaas's own nodes take the gateway's ``use_cached_tokens``)."""
    decode_max_batch: int | None = None
    """The most requests one of its decode steps holds (the engine's own cap,
    ``ENGINE_DECODE_MAX_BATCH``); None: the batch whose step meets the decode SLO (the cost
    model's ``max_decode_batch``)."""
    decode_pads_batch: bool = False
    """The decode nodes' engine pads a batch to its longest context (``engine.torch``: the
    batch's caches are left-padded into one), so a step costs what ``batch x longest`` context
    tokens cost; False: what their sum costs (paged engines, the timed engine)."""


@dataclass(frozen=True, slots=True)
class LengthConfig:
    kind: str = "lognormal"
    """``lognormal`` (truncated; the paper's workload) or ``fixed``."""
    mu: float = 9.90
    sigma: float = 1.00
    min_tokens: int = 128
    max_tokens: int = 131072
    fixed_tokens: int = 8192


@dataclass(frozen=True, slots=True)
class SimScenario:
    sites: tuple[SimSite, ...]
    links: tuple[LinkConfig, ...] = ()
    model: str = "paper-1t"
    policy: str = "threshold"
    """Router: local_only, naive, threshold or prfaas (the bandwidth-aware one)."""
    threshold_tokens: int = 19628
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    lengths: LengthConfig = field(default_factory=LengthConfig)
    output_tokens: int = 1024
    trace: str | None = None
    """A Mooncake JSONL trace to replay instead of synthetic arrivals."""
    trace_limit: int | None = None
    rate_scale: float = 1.0
    duration_s: float = 600.0
    """Arrivals stop here; the run then drains (at most ``drain_s`` more)."""
    drain_s: float = 600.0
    warmup_s: float = 0.0
    """Requests arriving earlier are served but not counted in latency metrics."""
    seed: int = 0
    max_prompt_tokens: int | None = None
    """Prompts longer than this (the model's context) are cut to it; None: no cut (the length
    distribution is already within it). ``scenarios.workload_lengths`` states the cut."""
    stratified: bool = False
    """Stratified length sampling (used by --find-max-rate; see workload/lengths.py)."""
    prefix_cache: bool = True
    block_tokens: int = 512
    checkpoint_every_blocks: int = 16
    slo_ttft_s: float = 10.0
    slo_tpot_s: float = 0.025
    local_fabric_gbps: float = 400.0
    """Per-transfer RDMA rate inside a site (only the last layer's share is exposed)."""
    prefill_token_budget: int = 32768
    decode_kv_fraction: float = 0.25
    """Share of a decode instance's HBM that holds KV (weights and activations take the rest)."""
    tune: bool | None = None
    """Re-search ``t`` online (default: on for the prfaas policy)."""
    rebalance: bool = False
    tune_min_samples: int = 100
    """Requests observed before ``t`` is re-searched or nodes rebalanced (the gateway's too)."""
    role_switch_s: float = 10.0
    """Time to reload a drained node in its new role."""
    control_interval_s: float = 1.0
    sample_interval_s: float = 1.0
    timeseries: bool = False
    plumbing_off: tuple[str, ...] = ()
    """Plumbing terms (``perf.plumbing.PLUMBING_TERMS``) not charged although the profiles
    measured them (``simulation.plumbing``)."""

    def validate(self) -> None:
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names):
            raise ScenarioError(f"duplicate site names {names}")
        pd = [s for s in self.sites if s.kind == "pd"]
        if not pd:
            raise ScenarioError("a scenario needs at least one pd site")
        for s in self.sites:
            if s.kind not in ("pd", "prfaas"):
                raise ScenarioError(f"site {s.name}: kind must be pd or prfaas, got {s.kind!r}")
            if s.num_prefill < 0 or s.num_decode < 0:
                raise ScenarioError(f"site {s.name}: negative node count")
            if s.kind == "pd" and s.num_decode == 0:
                raise ScenarioError(f"site {s.name}: no decode node (num_decode must be >= 1)")
            if s.kind == "prfaas" and s.num_decode:
                raise ScenarioError(f"site {s.name}: a prfaas site has no decode nodes")
            if s.cache_bytes_per_node < 0:
                raise ScenarioError(f"site {s.name}: negative cache size")
            one_each = (s.num_prefill, s.num_decode) == (1, 1)
            if s.mixed_steps and (s.shared_cores is None or not one_each):
                raise ScenarioError(
                    f"site {s.name}: mixed_steps needs shared_cores and one prefill and one "
                    "decode node"
                )
            if s.hosts_gateway and s.shared_cores is None:
                raise ScenarioError(f"site {s.name}: hosts_gateway needs shared_cores")
            if s.decode_max_batch is not None and s.decode_max_batch < 1:
                raise ScenarioError(
                    f"site {s.name}: decode_max_batch must be >= 1, got {s.decode_max_batch}"
                )
            if (s.shared_cores is not None and s.shared_cores < 1) or s.threads_per_node < 1:
                raise ScenarioError(
                    f"site {s.name}: shared_cores and threads_per_node must be >= 1"
                )
        known = set(names)
        for link in self.links:
            for end in (link.src, link.dst):
                if end not in known:
                    raise ScenarioError(f"link {link.src}-{link.dst}: unknown site {end!r}")
        remote = [s for s in self.sites if s.kind == "prfaas" and s.num_prefill > 0]
        uses_remote = self.policy != "local_only" and remote
        for home in pd:
            reachable = [
                r for r in remote if (lk := self.link_between(home.name, r.name)) is not None
                and lk.gbps > 0
            ]  # fmt: skip
            if uses_remote:
                for r in remote:
                    lk = self.link_between(home.name, r.name)
                    if lk is not None and lk.gbps == 0:
                        raise ScenarioError(
                            f"link {lk.src}-{lk.dst} has 0 Gbps but prfaas site {r.name} is in use"
                        )
            if home.num_prefill == 0 and (not uses_remote or not reachable):
                raise ScenarioError(
                    f"site {home.name}: no prefill node and no reachable prfaas site"
                )
            if self.policy == "naive" and not reachable:
                raise ScenarioError(f"policy naive: site {home.name} reaches no prfaas site")
        if self.output_tokens <= 0:
            raise ScenarioError(f"output tokens must be > 0, got {self.output_tokens}")
        if self.duration_s <= 0:
            raise ScenarioError(f"duration must be > 0 s, got {self.duration_s}")
        if self.rate_scale <= 0:
            raise ScenarioError(f"rate scale must be > 0, got {self.rate_scale}")
        if self.threshold_tokens < 0:
            raise ScenarioError(f"threshold must be >= 0 tokens, got {self.threshold_tokens}")
        if self.policy not in ("local_only", "naive", "threshold", "prfaas"):
            raise ScenarioError(f"unknown policy {self.policy!r}")
        from prfaas.perf.plumbing import PLUMBING_TERMS

        unknown = sorted(set(self.plumbing_off) - set(PLUMBING_TERMS))
        if unknown:
            raise ScenarioError(f"unknown plumbing term {unknown[0]!r}")

    def link_between(self, a: str, b: str) -> LinkConfig | None:
        for link in self.links:
            if {link.src, link.dst} == {a, b}:
                return link
        return None


@functools.lru_cache(maxsize=16)
def paper_plan(link_gbps: float = 100.0) -> Any:
    """The planner's result for the case study with ``link_gbps`` of PrfaaS egress (cached)."""
    from prfaas.analytic import Scenario, plan  # numpy/scipy, imported only when asked

    return plan(Scenario(link_gbps=link_gbps))


def paper_deployment(
    name: str,
    *,
    rate_rps: float = 2.0,
    threshold_tokens: int | None = None,
    n_p: int | None = None,
    n_d: int | None = None,
    link_gbps: float = 100.0,
    rtt_s: float = 0.005,
) -> SimScenario:
    """One of the case study's deployments (Table 6), counts and threshold from the planner.

    ``paper-prfaas``: 4 H200 PrfaaS + N_p/N_d H20 (planner: 3/5, t from the grid search);
    ``paper-homogeneous``: 12 H20 at the planner's 9/3; ``paper-naive``: 4 H200 + 8 H20 decode.
    """
    if name not in DEPLOYMENTS:
        raise ScenarioError(f"unknown deployment {name!r} (known: {', '.join(DEPLOYMENTS)})")
    result = paper_plan(link_gbps)
    arrival = ArrivalSpec("uniform", rate_rps)
    if name == "paper-homogeneous":
        d = result.homogeneous
        homog = (
            SimSite(
                "pd", "pd", "h20", d.n_p if n_p is None else n_p, d.n_d if n_d is None else n_d
            ),
        )
        return SimScenario(homog, (), policy="local_only", arrival=arrival, prefix_cache=False)
    d = result.prfaas if name == "paper-prfaas" else result.naive
    num_p = d.n_p if n_p is None else n_p
    num_d = d.n_d if n_d is None else n_d
    sites = (
        SimSite("pd", "pd", "h20", num_p, num_d),
        SimSite("prfaas", "prfaas", "h200", d.n_prfaas),
    )
    links = (LinkConfig("prfaas", "pd", link_gbps, rtt_s * 1000),)
    if name == "paper-naive":
        return SimScenario(sites, links, policy="naive", arrival=arrival, prefix_cache=False)
    t = threshold_tokens if threshold_tokens is not None else (d.threshold_tokens or 0)
    return SimScenario(
        sites, links, policy="threshold", threshold_tokens=t, arrival=arrival, prefix_cache=False
    )
