"""Which group a new pool node goes to, and which node a drain takes: the rules the elastic
simulator and a live provider share (``policy.Autoscaler`` decides how many; these decide which).

- add: the first spot group whose spot is available now; otherwise the first on-demand group (a
  *fallback* when a spot group exists: SkyServe's rule); None when neither can take one;
- drain: a starting node first (it serves nothing yet, nothing is lost), then an idle one, on-demand
  before spot (the dearer first), the first listed on ties (the oldest); busy nodes last.

Pure: no I/O, no clock; imports nothing from ``prfaas``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupKind:
    name: str
    spot: bool


@dataclass(frozen=True, slots=True)
class PoolNodeView:
    name: str
    group: str
    spot: bool
    starting: bool
    """Still starting (not yet in rotation)."""
    busy: bool
    """Holds a prefill now."""


@dataclass(frozen=True, slots=True)
class AddChoice:
    group: str
    fallback: bool
    """An on-demand group taken because no spot group had capacity."""


def group_for_add(
    groups: Sequence[GroupKind], spot_available: Callable[[str], bool]
) -> AddChoice | None:
    spot = [g for g in groups if g.spot]
    for g in spot:
        if spot_available(g.name):
            return AddChoice(g.name, False)
    for g in groups:
        if not g.spot:
            return AddChoice(g.name, bool(spot))
    return None


def node_to_drain(nodes: Sequence[PoolNodeView]) -> PoolNodeView | None:
    if not nodes:
        return None
    return min(nodes, key=lambda n: (not n.starting, n.busy, n.spot))  # min keeps the first
