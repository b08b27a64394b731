"""``LocalProvider`` against a fake launcher (no processes): generated names, a node held out of
rotation until its start-up has passed, then resumed; a drained node removed from the desired
set once nothing is in flight at it, or at its deadline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from prfaas.serve.elastic.local import LocalGroup, LocalProvider
from prfaas.serve.elastic.provider import NodePhase

pytestmark = pytest.mark.timeout(30)


@dataclass
class FakeControl:
    calls: list[tuple[str, str]] = field(default_factory=list)

    def drain(self, node: str) -> dict[str, Any]:
        self.calls.append(("drain", node))
        return {}

    def resume(self, node: str) -> dict[str, Any]:
        self.calls.append(("resume", node))
        return {}


@dataclass
class FakeLauncher:
    control: FakeControl = field(default_factory=FakeControl)
    added: list[tuple[str, str]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add_node(self, site: str, name: str) -> None:
        self.added.append((site, name))

    def remove(self, name: str) -> None:
        self.removed.append(name)

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.rows.values())


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_held_until_its_start_up_then_serving_then_drained_and_removed() -> None:
    launcher, clock = FakeLauncher(), Clock()
    p = LocalProvider(launcher, "prfaas", [LocalGroup("od", 10.0)], clock)
    assert p.add("od") == "prfaas-od-0" and p.add("od") == "prfaas-od-1"
    assert launcher.added == [("prfaas", "prfaas-od-0"), ("prfaas", "prfaas-od-1")]
    clock.now = 2.0
    p.poll()  # not registered yet: nothing to hold
    assert launcher.control.calls == []
    launcher.rows["prfaas-od-0"] = {"node": "prfaas-od-0", "in_rotation": True, "in_flight": 0}
    clock.now = 3.0
    p.poll()  # ready before its 10 s: held
    assert launcher.control.calls == [("drain", "prfaas-od-0")]
    assert p.nodes()[0].phase is NodePhase.STARTING
    clock.now = 10.5
    p.poll()
    assert launcher.control.calls[-1] == ("resume", "prfaas-od-0")
    assert p.nodes()[0].phase is NodePhase.SERVING and p.nodes()[0].ready_s == 10.5
    assert p.nodes()[1].phase is NodePhase.STARTING  # never registered: not ready
    launcher.rows["prfaas-od-0"]["in_flight"] = 2
    p.poll()
    assert p.nodes()[0].busy
    p.drain("prfaas-od-0")
    p.poll()  # two prefills in flight there: it stays
    assert not launcher.removed and p.nodes()[0].phase is NodePhase.DRAINING
    launcher.rows["prfaas-od-0"]["in_flight"] = 0
    p.poll()
    assert launcher.removed == ["prfaas-od-0"]
    assert [n.name for n in p.nodes()] == ["prfaas-od-1"]


def test_a_node_ready_after_its_start_up_is_not_held_and_a_deadline_ends_a_drain() -> None:
    launcher, clock = FakeLauncher(), Clock()
    p = LocalProvider(launcher, "prfaas", [LocalGroup("spot", 1.0, spot=True)], clock)
    name = p.add("spot")
    clock.now = 5.0
    launcher.rows[name] = {"node": name, "in_rotation": True, "in_flight": 1}
    p.poll()
    assert p.nodes()[0].phase is NodePhase.SERVING and p.nodes()[0].spot
    assert launcher.control.calls == []  # never held
    p.drain(name, deadline_s=8.0)
    clock.now = 7.0
    p.poll()
    assert not launcher.removed
    clock.now = 8.0
    p.poll()  # still busy, but the notice's deadline has come
    assert launcher.removed == [name] and not p.nodes()
