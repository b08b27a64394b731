"""``TenantRun``: one tenant's state and counts during a pool simulation (``sim.pool_sim``), and
``PoolRequest``, one of its requests. Held apart from the simulator so that its state reads as
one thing; ``sim.pool_view`` reads a run through a protocol of its own.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prfaas.perf.plumbing import NO_PLUMBING, PlumbingCosts
from prfaas.policy.pool_session import PoolSession
from prfaas.policy.pool_tenant_route import GateReading
from prfaas.policy.router import Router
from prfaas.policy.window import LengthWindow
from prfaas.sim.plumbing import GatewayCpu
from prfaas.sim.pool_prefixes import Store
from prfaas.sim.pool_scenario import PoolSimTenant
from prfaas.sim.pool_view import PoolTenantView


@dataclass(slots=True)
class PoolRequest:
    tenant: str
    request_id: str
    arrival_s: float
    num_tokens: int
    offloaded: bool = False
    ttft_s: float | None = None
    fell_back: bool = False
    block_hashes: tuple[int, ...] = ()
    """The prompt's chained block hashes (a trace's); empty: it can neither hit nor store."""
    pool_store: Store | None = None
    """The store of the pool node that ran it (its checkpoints go there at the end)."""
    pool_cached_tokens: int = 0
    """Prompt tokens its pool node found in the tenant's prefixes."""


@dataclass(slots=True)
class TenantRun:
    """One tenant's state and counts during a run."""

    spec: PoolSimTenant
    threshold_tokens: int = 0
    arrivals: Any = None
    trace_lengths: deque[int] | None = None
    trace_hashes: deque[tuple[int, ...]] | None = None
    rng: random.Random = field(default_factory=random.Random)
    window: LengthWindow = field(default_factory=LengthWindow)
    local_free: int = 0
    local_queue: deque[PoolRequest] = field(default_factory=deque)
    local_work_s: float = 0.0
    num_arrived: int = 0
    num_offloaded: int = 0
    num_local: int = 0
    num_kept_local_by_feedback: int = 0
    num_kept_local_for_link: int = 0
    """Requests the file's router kept home for the tenant's link (live: ``reason="link"``)."""
    refused: dict[str, int] = field(default_factory=dict)
    session: PoolSession = field(default_factory=lambda: PoolSession(3.0))
    ttft_s: list[float] = field(default_factory=list)
    fallback_ttft_s: list[float] = field(default_factory=list)
    num_completed: int = 0
    compute_s_in_window: dict[str, float] = field(default_factory=dict)
    threshold_updates: list[tuple[float, int]] = field(default_factory=list)
    local_plumbing: PlumbingCosts = NO_PLUMBING
    """The local prefill nodes' terms as charged (``sim.plumbing``): each local prefill pays
    ``prefill_overhead_s`` beyond its forward passes, on its node."""
    gateway: GatewayCpu | None = None
    """The tenant's gateway CPU (None: no gateway term charged): routes its arrivals in order."""
    router: Router | None = None
    """The tenant file's router (``policy.make_router``, as the live gateway builds it)."""
    view: PoolTenantView | None = None
    gate: Callable[[], GateReading | None] | None = None
    """The coordinated gate's inputs (None: not coordinated)."""
    pool_in_flight: int = 0
    pool_in_flight_tokens: int = 0
    """Offloads accepted whose KV has not arrived (the live registry's tracked pool work)."""
    pool_hit_tokens: int = 0
    pool_lookup_tokens: int = 0
    """Prompt tokens its pool prefills found in its prefixes at their nodes, and looked up
    (every pool prefill's whole prompt, as a live pool node looks each up)."""
