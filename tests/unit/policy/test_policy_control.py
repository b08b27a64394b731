"""``ControlPolicy.tick``: the one control decision both drivers carry out, as actions (a
rebalancer's plan: its role changes, then its threshold; else the tuner's threshold)."""

from __future__ import annotations

import random

import pytest

from prfaas.core import LinkState, MutableClusterView, NodeLoad, NodeRole, SiteKind
from prfaas.core.ids import LinkId, NodeId, SiteId
from prfaas.perf import cost_model_for
from prfaas.policy import ControlPolicy, RoleChange, SetThreshold, control_policy
from prfaas.policy.window import LengthWindow
from prfaas.workload import TruncatedLogNormal

pytestmark = pytest.mark.timeout(60)

PD, FAR = SiteId("pd"), SiteId("far")
GB = 1e9 / 8


def _view(n_p: int, n_d: int) -> MutableClusterView:
    v = MutableClusterView({PD: SiteKind.PD, FAR: SiteKind.PRFAAS}, threshold_tokens=19628)
    for i in range(n_p):
        v.update_node(NodeLoad(NodeId(f"pd/p{i}"), PD, NodeRole.PREFILL))
    for i in range(n_d):
        v.update_node(NodeLoad(NodeId(f"pd/d{i}"), PD, NodeRole.DECODE, kv_capacity_bytes=10**12))
    for i in range(4):
        v.update_node(NodeLoad(NodeId(f"far/p{i}"), FAR, NodeRole.PREFILL))
    v.update_link(LinkState(LinkId("far->pd"), 100 * GB))
    return v


def _policy(tune: bool, rebalance: bool) -> ControlPolicy:
    remote, local = cost_model_for("paper-1t", "h200"), cost_model_for("paper-1t", "h20")
    policy = control_policy(PD, [FAR], remote, local, tune=tune, rebalance=rebalance)
    rng = random.Random(0)
    dist = TruncatedLogNormal(9.9, 1.0, 128, 131072)
    for i in range(2000):  # 2.5 requests/s of the paper's lengths
        policy.observe(dist.draw(rng), 1024, i / 2.5)
    return policy


def test_a_rebalance_is_its_role_changes_then_its_threshold_and_the_tuner_waits() -> None:
    policy = _policy(tune=True, rebalance=True)
    actions = policy.tick(_view(6, 2), 800.0)
    changes = [a for a in actions if isinstance(a, RoleChange)]
    assert len(changes) == 3 and actions[:3] == tuple(changes)
    assert all(c.dst_role is NodeRole.DECODE for c in changes)
    last = actions[-1]
    assert isinstance(last, SetThreshold) and len(actions) == 4
    assert "6/2 -> 3/5" in last.reason
    assert policy.tuner is not None and policy.tuner._last_counts is None  # not asked this tick


def test_the_tuner_alone_answers_a_link_dip_and_nothing_else_acts() -> None:
    policy = _policy(tune=True, rebalance=False)
    v = _view(3, 5)
    assert policy.tick(v, 800.0) == ()  # the planned t fits at 100 Gbps
    v.update_link(LinkState(LinkId("far->pd"), 5 * GB))
    (action,) = policy.tick(v, 801.0)
    assert isinstance(action, SetThreshold) and action.threshold_tokens > 19628
    assert action.reason == "link capacity changed"


def test_the_construction_rule_both_drivers_share() -> None:
    local = cost_model_for("paper-1t", "h20")
    assert not control_policy(PD, [FAR], None, None, tune=True, rebalance=True).active
    assert control_policy(PD, [], None, local, tune=True, rebalance=False).tuner is None
    on = control_policy(PD, [FAR], None, local, tune=False, rebalance=True)
    assert on.active and on.tuner is None and on.rebalancer is not None
    assert ControlPolicy(None, None, LengthWindow(8)).tick(_view(1, 1), 0.0) == ()
