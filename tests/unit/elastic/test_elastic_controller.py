"""``ElasticController`` over an in-memory ``Provider``: a burst grows the group and the quiet
after it shrinks it, adds go spot-first with a counted on-demand fallback, drains take starting
nodes, then idle on-demand ones, then spot; every decision keeps its reason and desired size."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest

from prfaas.policy.autoscaler import AutoscaleConfig, Autoscaler, GroupObservation, ScaleAction
from prfaas.policy.pool_actions import GroupKind
from prfaas.serve.elastic.controller import ElasticController
from prfaas.serve.elastic.provider import NodePhase, ProvidedNode

pytestmark = pytest.mark.timeout(30)
SPEED = 10_000.0
CONFIG = AutoscaleConfig(min_nodes=1, max_nodes=8, startup_s=60, up_cooldown_s=10,
                         down_cooldown_s=30, down_stabilisation_s=30,
                         prior_tokens_per_s=SPEED)  # fmt: skip
GROUPS = (GroupKind("spot", True), GroupKind("on-demand", False))


@dataclass
class FakeProvider:
    """Nodes start in ``startup_s``; a drained node is gone at once (it holds nothing here)."""

    startup_s: float = 60.0
    now_s: float = 0.0
    live: list[ProvidedNode] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)

    def add(self, group: str) -> str:
        name = f"{group}-{len(self.added)}"
        self.added.append(name)
        self.live.append(ProvidedNode(name, group, group == "spot", NodePhase.STARTING,
                                      started_s=self.now_s))  # fmt: skip
        return name

    def drain(self, name: str, deadline_s: float | None = None) -> None:
        self.drained.append(name)
        self.live = [n for n in self.live if n.name != name]

    def nodes(self) -> Sequence[ProvidedNode]:
        return list(self.live)

    def advance(self, now_s: float) -> None:
        self.now_s = now_s
        self.live = [
            replace(n, phase=NodePhase.SERVING, ready_s=now_s)
            if n.phase is NodePhase.STARTING and now_s - n.started_s >= self.startup_s
            else n
            for n in self.live
        ]

    def observe(self, offered: float) -> GroupObservation:
        serving = sum(1 for n in self.live if n.phase is NodePhase.SERVING)
        starting = tuple(
            max(0.0, self.startup_s - (self.now_s - n.started_s))
            for n in self.live
            if n.phase is NodePhase.STARTING
        )
        return GroupObservation("pool", serving, starting, 0, 0, offered, SPEED)


def test_a_burst_grows_the_group_and_the_quiet_after_shrinks_it() -> None:
    provider = FakeProvider()
    ctl = ElasticController(Autoscaler(CONFIG), provider, GROUPS)
    sizes = []
    for step in range(0, 240):
        now = step * 5.0
        provider.advance(now)
        offered = 5 * SPEED if 200 <= now < 600 else 0.5 * SPEED
        d = ctl.tick(provider.observe(offered), now)
        assert d.reason and ctl.desired_nodes == d.desired_nodes
        sizes.append(len(provider.live))
    peak = max(sizes)
    assert peak >= 6 and sizes[-1] <= 2
    assert ctl.counts.added >= 6 and ctl.counts.drained >= 4
    assert ctl.counts.fallbacks == 0 and set(ctl.counts.by_group) == {"spot"}


def test_adds_fall_back_to_on_demand_while_spot_is_unavailable() -> None:
    provider = FakeProvider()
    ctl = ElasticController(Autoscaler(CONFIG), provider, GROUPS, spot_available=lambda _: False)
    d = ctl.tick(provider.observe(3 * SPEED), 0.0)
    assert d.action is ScaleAction.ADD
    assert all(n.group == "on-demand" for n in provider.live)
    assert ctl.counts.fallbacks == d.num_nodes > 0


def test_no_group_can_take_it_is_counted() -> None:
    provider = FakeProvider()
    ctl = ElasticController(Autoscaler(CONFIG), provider, (GroupKind("spot", True),),
                            spot_available=lambda _: False)  # fmt: skip
    ctl.tick(provider.observe(3 * SPEED), 0.0)
    assert not provider.live and ctl.counts.unplaced > 0


def test_drains_take_starting_then_idle_on_demand_then_spot() -> None:
    provider = FakeProvider()
    provider.live = [
        ProvidedNode("spot-a", "spot", True, NodePhase.SERVING),
        ProvidedNode("od-busy", "on-demand", False, NodePhase.SERVING, busy=True),
        ProvidedNode("od-idle", "on-demand", False, NodePhase.SERVING),
        ProvidedNode("spot-new", "spot", True, NodePhase.STARTING),
    ]
    ctl = ElasticController(Autoscaler(replace(CONFIG, min_nodes=0)), provider, GROUPS)
    for want in ("spot-new", "od-idle", "spot-a", "od-busy"):
        ctl._drain()
        assert provider.drained[-1] == want
