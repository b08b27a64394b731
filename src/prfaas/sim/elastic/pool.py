"""``PoolNode`` and ``NodeAccount``: one elastic pool node's life (starting, serving, draining,
gone) and the seconds it spent in each, which are what it costs. State only; ``ElasticSim``
moves nodes between states. Pure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class NodeState(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    """Takes no new prefill; finishes what it holds, then goes (a drain, or a spot notice)."""
    GONE = "gone"


@dataclass(slots=True)
class Job:
    index: int
    arrival_s: float
    num_tokens: int
    num_requeued: int = 0


@dataclass(slots=True)
class PoolNode:
    node_id: str
    group: str
    spot: bool
    launched_s: float
    state: NodeState = NodeState.STARTING
    ready_s: float | None = None
    gone_s: float | None = None
    job: Job | None = None
    job_end_s: float = 0.0
    """When the running prefill and its KV stream are expected to end."""
    job_prefill_end_s: float = 0.0
    job_start_s: float = 0.0
    version: int = 0
    """Bumped when the running job is taken away (a stale PREFILL_DONE is ignored)."""
    busy_s: float = 0.0
    """Prefill seconds (those that began at or after the run's ``measure_from_s``)."""
    noticed: bool = False

    def starting_s(self, end_s: float, from_s: float = 0.0) -> float:
        until = self.ready_s if self.ready_s is not None else (self.gone_s or end_s)
        return max(0.0, min(until, end_s) - max(self.launched_s, from_s))

    def serving_s(self, end_s: float, from_s: float = 0.0) -> float:
        if self.ready_s is None:
            return 0.0
        until = self.gone_s if self.gone_s is not None else end_s
        return max(0.0, min(until, end_s) - max(self.ready_s, from_s))


@dataclass(frozen=True, slots=True)
class GroupHours:
    group: str
    spot: bool
    starting_h: float
    busy_h: float
    idle_h: float
    usd: float

    @property
    def total_h(self) -> float:
        return self.starting_h + self.busy_h + self.idle_h


def group_hours(
    group: str, spot: bool, nodes: list[PoolNode], end_s: float, usd_per_hour: float,
    from_s: float = 0.0,
) -> GroupHours:  # fmt: skip
    starting = sum(n.starting_s(end_s, from_s) for n in nodes) / 3600
    serving = sum(n.serving_s(end_s, from_s) for n in nodes) / 3600
    busy = min(serving, sum(n.busy_s for n in nodes) / 3600)
    return GroupHours(group, spot, starting, busy, serving - busy,
                      (starting + serving) * usd_per_hour)  # fmt: skip
