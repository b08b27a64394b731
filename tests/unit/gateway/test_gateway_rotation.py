"""Node rotation: each way out of rotation and its way back (registry + ``Rotation``)."""

from __future__ import annotations

import pytest
from gateway_fakes import heartbeat, make_registry, register_all

from prfaas.core import NodeRole
from prfaas.serve.gateway.rotation import QUARANTINE_MAX_S, Rotation

pytestmark = pytest.mark.timeout(10)


def test_silent_node_leaves_and_rejoins_by_registering_again() -> None:
    reg = make_registry()
    register_all(reg, now_s=0.0)
    timeout = reg.deployment.gateway.heartbeat_timeout_s
    assert heartbeat(reg, "d0", 1.0)
    gone = reg.expire(timeout + 0.5)
    assert "d0" not in gone and "d1" in gone  # d1 said nothing since registering at 0
    assert reg.rotation("d1") == (False, "silent: no heartbeat within the timeout")
    assert not heartbeat(reg, "d1", 5.0)  # unknown process now: it must register again
    register_all(reg, now_s=5.0)  # a restarted node registers: back at once
    assert reg.rotation("d1") == (True, "")


def test_fault_report_takes_the_node_out_until_a_clean_report() -> None:
    reg = make_registry()
    register_all(reg)
    heartbeat(reg, "p0", 1.0, fault="engine thread died: RuntimeError")
    ok, why = reg.rotation("p0")
    assert not ok and why.startswith("fault: engine thread died")
    assert not reg.view.node("p0").healthy  # type: ignore[arg-type]
    heartbeat(reg, "p0", 2.0)
    assert reg.rotation("p0") == (True, "")


def test_quarantine_doubles_with_each_failure_and_success_resets_it() -> None:
    rot = Rotation(NodeRole.PREFILL)
    spans = []
    for i in range(12):
        rot.on_unreachable("refused", now_s=100.0 * i)
        spans.append(rot.quarantine_until_s - 100.0 * i)
    assert spans[:4] == [0.5, 1.0, 2.0, 4.0]
    assert max(spans) == QUARANTINE_MAX_S
    rot.on_report(NodeRole.PREFILL, draining=False, fault="", now_s=1100.0 + QUARANTINE_MAX_S)
    assert rot.healthy
    rot.on_success()
    rot.on_unreachable("refused", now_s=5000.0)
    assert rot.quarantine_until_s - 5000.0 == 0.5


def test_refusal_is_held_only_until_a_report_sent_after_it() -> None:
    reg = make_registry()
    register_all(reg)
    reg.mark_refused("p0", 10.0)
    heartbeat(reg, "p0", 10.1)  # composed before the node heard: still held
    assert not reg.rotation("p0")[0]
    heartbeat(reg, "p0", 10.0 + reg.deployment.heartbeat_interval_s)
    assert reg.rotation("p0") == (True, "")


def test_role_switch_is_held_until_the_node_reports_it() -> None:
    reg = make_registry()
    register_all(reg)
    reg.mark_switching("p1")
    heartbeat(reg, "p1", 50.0)  # old role, not draining: sent before it heard
    assert reg.rotation("p1") == (False, "switching role from prefill")
    heartbeat(reg, "p1", 51.0, draining=True)
    assert reg.rotation("p1") == (False, "draining")
    heartbeat(reg, "p1", 52.0, role="decode")
    assert reg.rotation("p1") == (True, "")


def test_a_node_belongs_to_the_process_that_registered_it_last() -> None:
    from prfaas.serve.node.messages import NodeEndpoint, Registration

    reg = make_registry()
    register_all(reg)
    ep = NodeEndpoint(node="d0", site="pd", role="decode", host="h2", http_port=9, transfer_port=8)
    reg.register(Registration(process="new-d0", nodes=[ep]), 1.0)
    assert reg.endpoints["d0"].host == "h2"
    assert "d0" not in reg.processes  # the old process owned only d0: forgotten
    assert reg.processes["new-d0"].nodes == ["d0"]


def test_unknown_node_has_no_rotation() -> None:
    reg = make_registry()
    with pytest.raises(KeyError):
        reg.rotation("nope")


def test_a_process_of_many_nodes_gets_a_short_stable_unique_name() -> None:
    from prfaas.serve.node.host import MAX_PROCESS_NAME_BYTES, default_process_name

    nine = [f"pd-p{i}" for i in range(9)] + [f"pd-d{i}" for i in range(3)]
    name = default_process_name(nine)
    assert len(name.encode()) <= MAX_PROCESS_NAME_BYTES  # the demo's 12-node site overflowed it
    assert name == default_process_name(nine)  # the gateway keys processes by it: restarts too
    assert name != default_process_name([*nine[:-1], "pd-d9"])
    assert default_process_name(["p0", "d0"]) == "p0+d0"


def test_requests_failing_at_once_are_one_strike() -> None:
    """Found by killing a node process under 40 concurrent requests: each in-flight request's
    failure doubled the quarantine, so the restarted node stayed out for the 30 s maximum."""
    rot = Rotation(NodeRole.DECODE)
    for _ in range(40):
        rot.on_unreachable("connect refused", now_s=10.0)
    assert rot.num_strikes == 1 and rot.quarantine_until_s == 10.5
    rot.on_report(NodeRole.DECODE, draining=False, fault="", now_s=11.0)
    assert rot.healthy
    rot.on_unreachable("connect refused", now_s=12.0)  # out again after readmission: a strike
    assert rot.num_strikes == 2 and rot.quarantine_until_s == 13.0
