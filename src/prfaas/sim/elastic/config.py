"""``ElasticScenario``: what one run of the elastic-pool simulator needs, as frozen dataclasses.

A *group* is a set of PrfaaS prefill nodes of one hardware behind the pool's one admission
queue, on-demand or spot (``spot``: a price, a notice, and preemptions as a rate or a replayed
0/1 availability trace). Validation names the bad field in one line (``ScenarioError``).
``PreemptionConfig`` is THE description of when spot capacity goes, read alike by the simulator
and the live loop (``serve/elastic/loop.py``): ``available(at_s)`` for the trace,
``notice_at_s(rng, launched_s)`` for the rate. Pure: no clock, no I/O (the trace text is parsed
here, read by the caller); randomness is a seeded ``random.Random`` passed in.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from prfaas.policy.autoscaler import AutoscaleConfig
from prfaas.sim.scenario import ScenarioError


@dataclass(frozen=True, slots=True)
class PreemptionConfig:
    mttp_s: float | None = None
    """Mean time to preemption per node (exponential from its launch); None: no rate."""
    trace: tuple[int, ...] = ()
    """Spot availability per interval (1: available, 0: every spot node gets its notice and no
    spot node can start: SkyPilot's public spot traces have this shape); replayed cyclically."""
    interval_s: float = 600.0
    """The trace's interval."""

    def available(self, at_s: float) -> bool:
        """Whether spot capacity is available ``at_s`` seconds into the run (always, without a
        trace): the simulator and the live loop read the one trace the same way."""
        if not self.trace:
            return True
        return self.trace[int(at_s // self.interval_s) % len(self.trace)] == 1

    def notice_at_s(self, rng: random.Random, launched_s: float) -> float | None:
        """When a spot node launched at ``launched_s`` gets its notice from the rate: an
        exponential time to preemption (mean ``mttp_s``) after its launch, one draw from ``rng``;
        None (and no draw) without a rate. The simulator draws at each spot node's launch, the
        live loop at its first look at each node, both in launch order from a generator seeded
        with the file's seed, so the same file gives the same notices (the seconds are the
        caller's: modelled in the simulator, the loop's own seconds live)."""
        if self.mttp_s is None:
            return None
        return launched_s + rng.expovariate(1.0 / self.mttp_s)


@dataclass(frozen=True, slots=True)
class GroupConfig:
    name: str
    hardware: str = "h200"
    spot: bool = False
    usd_per_hour: float | None = None
    """Per node; required for a spot group (on-demand: the assumed price of its hardware)."""
    notice_s: float = 120.0
    """Spot: seconds from the notice to the node's end (AWS 120 s, GCP 30 s)."""
    startup_s: float = 180.0
    """Modelled start-up: a starting node costs money and serves nothing."""
    initial_nodes: int = 0
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)


@dataclass(frozen=True, slots=True)
class ElasticScenario:
    groups: tuple[GroupConfig, ...]
    autoscale: AutoscaleConfig | None = None
    """None: the groups keep their ``initial_nodes`` (a fixed pool)."""
    model: str = "paper-1t"
    local_hardware: str = "h20"
    num_local_prefill: int = 4
    """The PD site's prefill nodes: short prompts, and the fallback for long ones."""
    threshold_tokens: int = 8192
    """Prompts longer than this are offered to the pool."""
    ttft_slo_s: float = 4.0
    link_gbps: float = 100.0
    rtt_s: float = 0.01
    tick_s: float = 5.0
    """The autoscaler looks this often (Dynamo's load loop: 5 s)."""
    rate_window_s: float = 60.0
    """Offered tokens/s is measured over this window."""
    seed: int = 0
    bound_interval_s: float = 300.0
    """The steady-state bound's interval (``bound.py``)."""
    measure_from_s: float = 0.0
    """Node-hours, $ and TTFT count from here (a warm-up before it: e.g. one season, in which a
    seasonal autoscaler learns its history; fixed and autoscaled runs share the window)."""

    def validate(self) -> None:
        if not self.groups:
            raise ScenarioError("groups: at least one group is needed")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ScenarioError(f"groups: names must differ, got {names}")
        for g in self.groups:
            where = f"groups.{g.name}"
            if g.spot and g.usd_per_hour is None:
                raise ScenarioError(f"{where}.usd_per_hour: a spot group needs its price")
            if g.usd_per_hour is not None and not g.usd_per_hour > 0:
                raise ScenarioError(f"{where}.usd_per_hour must be > 0, got {g.usd_per_hour}")
            for name in ("notice_s", "startup_s"):
                value = getattr(g, name)
                if not (value >= 0 and math.isfinite(value)):
                    raise ScenarioError(f"{where}.{name} must be >= 0, got {value}")
            if g.initial_nodes < 0:
                raise ScenarioError(f"{where}.initial_nodes must be >= 0, got {g.initial_nodes}")
            p = g.preemption
            if (p.mttp_s is not None or p.trace) and not g.spot:
                raise ScenarioError(f"{where}.preemption: only a spot group is preempted")
            if p.mttp_s is not None and not p.mttp_s > 0:
                raise ScenarioError(f"{where}.preemption.mttp_s must be > 0, got {p.mttp_s}")
            if not p.interval_s > 0:
                raise ScenarioError(
                    f"{where}.preemption.interval_s must be > 0, got {p.interval_s}"
                )
        if self.num_local_prefill < 1:
            raise ScenarioError(f"num_local_prefill must be >= 1, got {self.num_local_prefill}")
        if self.measure_from_s < 0:
            raise ScenarioError(f"measure_from_s must be >= 0, got {self.measure_from_s}")
        for name in ("ttft_slo_s", "link_gbps", "tick_s", "rate_window_s", "bound_interval_s"):
            if not getattr(self, name) > 0:
                raise ScenarioError(f"{name} must be > 0, got {getattr(self, name)}")


def parse_availability(text: str, where: str = "preemption.trace") -> tuple[int, ...]:
    """A 0/1 availability trace: digits, optionally separated by commas, spaces or newlines
    (``1,1,0,1`` or ``1101``). One-line error naming ``where`` and the first bad item."""
    items = [c for c in text.replace(",", " ").split()]
    if len(items) == 1:
        items = list(items[0])
    out: list[int] = []
    for i, item in enumerate(items):
        if item not in ("0", "1"):
            raise ScenarioError(f"{where}: item {i} is {item!r}, not 0 or 1")
        out.append(int(item))
    if not out:
        raise ScenarioError(f"{where}: empty")
    return tuple(out)
