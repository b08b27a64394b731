"""``ElasticController``: one look of the autoscaler, carried out through a ``Provider``.

Each ``tick(observation, now_s)`` asks ``policy.Autoscaler`` and acts on its decision: an add
goes to the group ``policy.pool_actions.group_for_add`` picks (spot while available, else the
on-demand fallback, counted), a drain takes the node ``node_to_drain`` picks (starting, then idle,
on-demand before spot): the simulator's rules, so a live run and a simulated one make the same
choices. It keeps the last decision (its reason and the desired size, for ``/metrics`` as
``prfaas_autoscale_desired_nodes{group}`` and ``prfaas status``) and the counts of what it did.
No clock (``now_s`` is passed in) and no I/O of its own: the provider does that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prfaas.policy.autoscaler import Autoscaler, GroupObservation, ScaleAction, ScaleDecision
from prfaas.policy.pool_actions import GroupKind, PoolNodeView, group_for_add, node_to_drain
from prfaas.serve.elastic.provider import NodePhase, Provider

log = logging.getLogger("prfaas.elastic")


@dataclass
class ControllerCounts:
    added: int = 0
    drained: int = 0
    fallbacks: int = 0
    unplaced: int = 0
    """Adds no group could take (spot unavailable and no on-demand group)."""
    by_group: dict[str, int] = field(default_factory=dict)


class ElasticController:
    def __init__(
        self,
        autoscaler: Autoscaler,
        provider: Provider,
        groups: Sequence[GroupKind],
        spot_available: Callable[[str], bool] = lambda _: True,
    ) -> None:
        self.autoscaler = autoscaler
        self.provider = provider
        self.groups = tuple(groups)
        self.spot_available = spot_available
        self.last: ScaleDecision | None = None
        self.counts = ControllerCounts()

    @property
    def desired_nodes(self) -> int | None:
        return None if self.last is None else self.last.desired_nodes

    def tick(self, obs: GroupObservation, now_s: float) -> ScaleDecision:
        d = self.autoscaler.decide(obs, now_s)
        self.last = d
        if d.action is ScaleAction.ADD:
            for _ in range(d.num_nodes):
                self._add()
        elif d.action is ScaleAction.DRAIN:
            for _ in range(d.num_nodes):
                self._drain()
        if d.action is not ScaleAction.HOLD:
            log.info("group %s: %s %d (%s)", d.group, d.action.value, d.num_nodes, d.reason)
        return d

    def _add(self) -> None:
        choice = group_for_add(self.groups, self.spot_available)
        if choice is None:
            self.counts.unplaced += 1
            return
        self.provider.add(choice.group)
        c = self.counts
        c.added += 1
        c.fallbacks += choice.fallback
        c.by_group[choice.group] = c.by_group.get(choice.group, 0) + 1

    def _drain(self) -> None:
        live = [
            n for n in self.provider.nodes() if n.phase in (NodePhase.STARTING, NodePhase.SERVING)
        ]
        chosen = node_to_drain(
            [PoolNodeView(n.name, n.group, n.spot, n.phase is NodePhase.STARTING, n.busy)
             for n in live]
        )  # fmt: skip
        if chosen is not None:
            self.provider.drain(chosen.name)
            self.counts.drained += 1
