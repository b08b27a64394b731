"""What the pool simulator is given: the pool (its shape and each group's node cost model) and its
tenants (each with its own arrivals, lengths, link, model and local prefill nodes).

Built from the very files ``prfaas up`` runs (``commands/sim_pool.py``), or directly in tests.
Each group's and tenant's ``cost`` is its profile as the routers and tuners read it; what the
simulated processes are charged of its plumbing terms is ``plumbing_off``'s business
(``sim.plumbing``; the pool file's ``simulation.plumbing`` for a group, the tenant file's for a
tenant). The pool's prefix stores (``docs/pool.md``, *Prefixes*): a store per group's node process
(``per_node_stores``: one per node, as ``processes: per_node``; else one the group's nodes share,
as ``shared``), of a timed node's size (``cache.prefix_quotas.timed_store_bytes``), each tenant's
prefixes in a namespace of its own under its quota (``prefix_shares``, ``share_prefixes``).
Pure: frozen dataclasses; no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from prfaas.cache.prefix_quotas import check_shares, prefix_shares, timed_store_bytes
from prfaas.perf import CostModel
from prfaas.perf.plumbing import PLUMBING_TERMS
from prfaas.policy.pool_coordination import TUNE_MIN_SAMPLES, TUNE_PERIOD_S, TUNE_WINDOW_SIZE
from prfaas.policy.pool_shares import PoolShape
from prfaas.policy.pool_tenant_route import POOL_SITE
from prfaas.policy.router import ROUTER_NAMES
from prfaas.workload import ArrivalSpec

TunerKind = Literal["coordinated", "uncoordinated", "fixed"]


class LengthSampler(Protocol):
    def draw(self, rng: random.Random) -> int: ...


def _known_terms(who: str, terms: tuple[str, ...]) -> None:
    unknown = sorted(set(terms) - set(PLUMBING_TERMS))
    if unknown:
        raise ValueError(f"{who}: unknown plumbing term {unknown[0]!r}")


@dataclass(frozen=True, slots=True)
class PoolSimGroup:
    name: str
    model: str
    num_nodes: int
    cost: CostModel
    """The group's node profile: ``T_prefill`` and ``S_kv`` of every prefill placed here, and
    its nodes' ``prefill_per_request_s``."""
    plumbing_off: tuple[str, ...] = ()
    """Plumbing terms (``perf.plumbing.PLUMBING_TERMS``) the group's nodes are not charged."""
    node_names: tuple[str, ...] = ()
    """The nodes' names (the pool file's; empty: ``NAME-0``...): ties in placement go to the
    first free node by name, as live."""
    per_node_stores: bool = False
    """A prefix store per node (``processes: per_node``); False: one store the group's nodes
    share, as one process (``shared``, the pool file's default without ``notice_s``)."""
    prefix_store_bytes: int | None = None
    """Each store's capacity in modelled bytes (None: a timed node process's,
    ``timed_store_bytes`` of the group's hardware)."""
    checkpoint_every_blocks: int = 16
    """The stores keep a checkpoint every this many blocks and at a prompt's last full block
    (a pool node's ``engine.checkpoint_every_blocks``)."""

    def __post_init__(self) -> None:
        _known_terms(f"group {self.name}", self.plumbing_off)
        if self.node_names and len(self.node_names) != self.num_nodes:
            raise ValueError(f"group {self.name}: {len(self.node_names)} node names for "
                             f"{self.num_nodes} nodes")  # fmt: skip
        if self.prefix_store_bytes is not None and self.prefix_store_bytes < 0:
            raise ValueError(f"group {self.name}: prefix_store_bytes must be >= 0")
        if self.checkpoint_every_blocks <= 0:
            raise ValueError(f"group {self.name}: checkpoint_every_blocks must be > 0")

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.node_names or tuple(f"{self.name}-{i}" for i in range(self.num_nodes))

    @property
    def store_bytes(self) -> int:
        """Each of its prefix stores' capacity (modelled bytes)."""
        if self.prefix_store_bytes is not None:
            return self.prefix_store_bytes
        return timed_store_bytes(self.cost.hardware.instance_memory_bytes)


@dataclass(frozen=True, slots=True)
class PoolSimTenant:
    name: str
    model: str
    arrival: ArrivalSpec
    lengths: LengthSampler
    num_local_prefill: int
    local_cost: CostModel
    """The tenant's own PD site's profile: its prefill nodes' and its gateway's."""
    link_bytes_per_s: float
    """The tenant's own link from the pool (modelled bytes/s)."""
    rtt_s: float = 0.0
    threshold_tokens: int | None = None
    """Offload when the uncached length is over this; None: the tuner's first choice."""
    tuner: TunerKind = "coordinated"
    ttft_target_s: float = 4.0
    start_s: float = 0.0
    stop_s: float | None = None
    """Arrivals end here (None: the scenario's ``duration_s``)."""
    seed: int = 0
    trace: tuple[tuple[float, int], ...] | None = None
    """Replayed instead of ``arrival`` and ``lengths``: (arrival_s, prompt tokens), in order.
    Every prompt token counts as uncached at home (the tenant's own prefix cache is not
    modelled)."""
    trace_block_hashes: tuple[tuple[int, ...], ...] | None = None
    """The trace's prompts' chained block hashes, one tuple per record (a Mooncake trace's
    ``hash_ids``): what the pool's prefix stores key them by. None or empty: no prefix hits."""
    plumbing_off: tuple[str, ...] = ()
    """Plumbing terms the tenant's local prefill nodes and gateway are not charged."""
    home_site: str = "home"
    """The tenant's PD site's name (its view's home site; not ``policy.POOL_SITE``)."""
    router: str = "threshold"
    """The tenant file's ``policy.router``: ``policy.make_router`` builds it, as the live gateway
    does, and it routes each request over the tenant's view (``sim/pool_view.py``)."""
    router_remote: CostModel | None = None
    router_local: CostModel | None = None
    """The router's cost models, as the live gateway gives them (the tenant file with its pool
    site: ``scenarios.deployment_cost_models``): both or neither."""

    def __post_init__(self) -> None:
        _known_terms(f"tenant {self.name}", self.plumbing_off)
        if self.router not in ROUTER_NAMES:
            raise ValueError(
                f"tenant {self.name}: unknown router {self.router!r} "
                f"(known: {', '.join(ROUTER_NAMES)})"
            )
        if self.home_site == POOL_SITE:
            raise ValueError(f"tenant {self.name}: home site {POOL_SITE!r} is the pool's name")
        if (self.router_remote is None) != (self.router_local is None):
            raise ValueError(f"tenant {self.name}: the router's cost models: both or neither")
        if self.num_local_prefill < 0:
            raise ValueError(f"tenant {self.name}: num_local_prefill must be >= 0")
        if not self.link_bytes_per_s > 0:
            raise ValueError(f"tenant {self.name}: link must be > 0 bytes/s")
        if self.trace_block_hashes is not None and (
            self.trace is None or len(self.trace) != len(self.trace_block_hashes)
        ):
            raise ValueError(f"tenant {self.name}: trace_block_hashes: one per trace record")


@dataclass(frozen=True, slots=True)
class PoolSimScenario:
    shape: PoolShape
    groups: tuple[PoolSimGroup, ...]
    tenants: tuple[PoolSimTenant, ...]
    duration_s: float = 300.0
    drain_s: float = 600.0
    tune_interval_s: float = TUNE_PERIOD_S
    tune_min_samples: int = TUNE_MIN_SAMPLES
    window_size: int = TUNE_WINDOW_SIZE
    """The tenants' tuners (``policy.pool_coordination``'s constants, a live tenant's too)."""
    measure_from_s: float = 0.0
    measure_to_s: float | None = None
    """Shares and TTFTs are measured over [from, to] (None: ``duration_s``)."""
    front_door_outages: tuple[tuple[float, float], ...] = ()
    """(at_s, down_s): the front door dies at ``at_s`` (its queue is lost; started prefills go on:
    their KV does not pass through it) and comes back ``down_s`` later with a new epoch."""
    pool_node_failures: tuple[tuple[float, str, float], ...] = ()
    """(at_s, group, down_s): a node of ``group`` is lost at ``at_s`` for ``down_s``; the prefill
    it was running (the oldest running on the group, if any) fails, its KV stream with it, and its
    tenant is told (``failed:node_lost``) and prefills it locally."""
    heartbeat_interval_s: float = 0.5
    """Tenants' heartbeats (only simulated when there are outages)."""
    silence_s: float = 3.0
    """A tenant whose pool has not answered for this long sends its pending prefills local (a
    live tenant's gateway uses its ``heartbeat_timeout_s``, 3 s by default)."""
    block_tokens: int = 512
    """The pool's block (``units.block_tokens``): what its prefix stores' hashes cover."""
    share_prefixes: bool = False
    """One namespace every tenant shares, no quotas (the pool file's ``share_prefixes``)."""
    prefix_shares: Mapping[str, float] = field(default_factory=dict)
    """Tenant -> its guaranteed share of each store (``PoolFileConfig.prefix_shares``); a tenant
    not named here: by weight, ``cache.prefix_quotas.prefix_shares`` over the shape's tenants."""

    def __post_init__(self) -> None:
        names = [t.name for t in self.tenants]
        pool_names = [t.name for t in self.shape.tenants]
        for t in self.tenants:
            if t.name not in pool_names:
                raise ValueError(f"tenant {t.name!r} is not a tenant of the pool")
            if self.shape.group_for_model(t.model) is None:
                raise ValueError(f"tenant {t.name}: model {t.model!r} is not served by the pool")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tenant names in {names}")
        for g in self.groups:
            shape_g = self.shape.group(g.name)
            if shape_g.model != g.model or shape_g.num_nodes != g.num_nodes:
                raise ValueError(f"group {g.name}: differs from the pool's shape")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {self.block_tokens}")
        check_shares(self.shares)

    @property
    def shares(self) -> dict[str, float]:
        """Each tenant's guaranteed share of a store: ``prefix_shares`` given for it, else its
        weight's part of what those leave (the live rule, ``cache.prefix_quotas``)."""
        told = self.prefix_shares
        return prefix_shares([(t.name, t.weight, told.get(t.name)) for t in self.shape.tenants])

    @property
    def window_end_s(self) -> float:
        return self.duration_s if self.measure_to_s is None else self.measure_to_s

    def group_for(self, model: str) -> PoolSimGroup:
        return next(g for g in self.groups if g.model == model)
