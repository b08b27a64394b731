"""``ElasticReport``: what one elastic-pool run measured: node-hours per group (starting, busy,
idle), $ (on-demand and spot), scale events, preemptions with what the notices finished and
handed back, on-demand fallbacks, TTFT P50/P90 and SLO attainment, and the nodes-over-time
series for the plot. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prfaas.sim.elastic.bound import BOUND_NOTE
from prfaas.sim.elastic.pool import GroupHours


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    at_s: float
    action: str
    num_nodes: int
    reason: str


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    num_serving: int
    num_starting: int
    offered_tokens_per_s: float
    desired_nodes: int


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[k]


@dataclass(frozen=True, slots=True)
class ElasticReport:
    groups: tuple[GroupHours, ...]
    num_requests: int
    num_completed: int
    num_measured: int
    """Requests that arrived in the measured window (TTFT figures are theirs)."""
    num_offloaded: int
    num_local_for_capacity: int
    """Long prompts sent local because the pool could not serve them in time."""
    ttft_p50_s: float
    ttft_p90_s: float
    attainment: float
    """Share of requests whose TTFT met the SLO (0..1)."""
    scale_events: tuple[ScaleEvent, ...]
    num_preemptions: int
    num_finished_on_notice: int
    num_requeued_on_notice: int
    num_fallbacks: int
    """Adds that went on-demand because spot was unavailable."""
    samples: tuple[Sample, ...] = field(default=(), repr=False)
    bound: tuple[tuple[float, int], ...] = field(default=(), repr=False)
    """(interval start s, nodes): the steady-state bound per interval, ignoring start-up."""

    @property
    def node_hours(self) -> float:
        return sum(g.total_h for g in self.groups)

    @property
    def usd(self) -> float:
        return sum(g.usd for g in self.groups)

    def num_scale(self, action: str) -> int:
        return sum(1 for e in self.scale_events if e.action == action)

    def as_dict(self) -> dict[str, Any]:
        return {
            "node_hours": round(self.node_hours, 3),
            "usd": round(self.usd, 2),
            "groups": {
                g.group: {
                    "spot": g.spot,
                    "starting_h": round(g.starting_h, 3),
                    "busy_h": round(g.busy_h, 3),
                    "idle_h": round(g.idle_h, 3),
                    "usd": round(g.usd, 2),
                }
                for g in self.groups
            },
            "requests": self.num_requests,
            "completed": self.num_completed,
            "measured": self.num_measured,
            "offloaded": self.num_offloaded,
            "local_for_capacity": self.num_local_for_capacity,
            "ttft_p50_s": round(self.ttft_p50_s, 3),
            "ttft_p90_s": round(self.ttft_p90_s, 3),
            "slo_attainment": round(self.attainment, 4),
            "scale_ups": self.num_scale("add"),
            "scale_downs": self.num_scale("drain"),
            "preemptions": self.num_preemptions,
            "finished_on_notice": self.num_finished_on_notice,
            "requeued_on_notice": self.num_requeued_on_notice,
            "fallbacks": self.num_fallbacks,
            "steady_state_bound": {
                "note": BOUND_NOTE,
                "intervals": [[round(t, 1), n] for t, n in self.bound],
            },
        }
