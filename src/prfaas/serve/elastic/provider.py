"""``Provider``: how an elastic pool's nodes are started, drained and listed, whatever runs them.

Three calls, small enough for a Kubernetes implementation (a replica patch, or KEDA reading the
desired size from ``/metrics``) as well as a local one (processes under the supervisor's desired
set): ``add(group)`` starts one node in a group and returns its generated name; ``drain(name,
deadline_s)`` takes it out of rotation, lets it finish what it holds (by ``deadline_s`` when given:
a spot notice) and removes it; ``nodes()`` lists every node with its phase. A provider never
decides how many nodes or which: ``ElasticController`` does, from the policy.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class NodePhase(enum.Enum):
    STARTING = "starting"
    """Asked for; held out of rotation until its start-up has passed and it is ready."""
    SERVING = "serving"
    DRAINING = "draining"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class ProvidedNode:
    name: str
    group: str
    spot: bool
    phase: NodePhase
    busy: bool = False
    """Holds a prefill now."""
    started_s: float = 0.0
    """When it was asked for (the provider's clock)."""
    ready_s: float | None = None
    """When it entered rotation."""


class Provider(Protocol):
    def add(self, group: str) -> str:
        """Start one node in ``group``; its generated name."""
        ...

    def drain(self, name: str, deadline_s: float | None = None) -> None:
        """Out of rotation now; removed once it holds nothing (or at ``deadline_s``)."""
        ...

    def nodes(self) -> Sequence[ProvidedNode]:
        """Every node not yet gone, oldest first."""
        ...
