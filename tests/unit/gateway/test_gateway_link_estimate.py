"""The gateway's LinkState takes the PrfaaS senders' measured capacity (``core.link_estimate``),
the deployment file's rate until they measured, and the tuner re-searches ``t`` when it moves."""

from __future__ import annotations

import pytest
from gateway_fakes import heartbeat, link_report, make_registry, register_all

from prfaas.core import SiteId
from prfaas.core.views import LinkState
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import Heartbeat, NodeEndpoint, NodeReport, Registration

pytestmark = pytest.mark.timeout(30)

CONFIGURED = 100e9 / 8
"""gateway_fakes' link: 100 Gbps."""


def _state(registry: NodeRegistry) -> LinkState:
    (state,) = registry.link_states()
    return state


def test_configured_until_measured_then_the_estimate_and_its_backlog() -> None:
    registry = make_registry()
    register_all(registry)
    assert _state(registry).capacity_bytes_per_s == CONFIGURED
    heartbeat(registry, "pf0", 0.1, link_report(configured_bytes_per_s=CONFIGURED,
              capacity_bytes_per_s=CONFIGURED, basis="configured"))  # fmt: skip
    assert (_state(registry).capacity_bytes_per_s, _state(registry).capacity_basis) == (
        CONFIGURED, "configured"
    )  # fmt: skip
    heartbeat(registry, "pf0", 0.2, link_report(configured_bytes_per_s=CONFIGURED,
              capacity_bytes_per_s=1e9, basis="measured", backlog_bytes=int(3e9)),
              egress_backlog_bytes=0)  # fmt: skip
    state = _state(registry)
    assert (state.capacity_bytes_per_s, state.capacity_basis) == (1e9, "measured")
    assert state.backlog_bytes == 3e9 and state.drain_time_s() == pytest.approx(3.0)
    assert state.congested  # 3 s of backlog at the measured rate


def test_a_node_that_does_not_estimate_keeps_the_paced_rate() -> None:
    registry = make_registry()
    register_all(registry)
    heartbeat(
        registry, "pf0", 0.1, link_report(configured_bytes_per_s=2e9, capacity_bytes_per_s=1.0)
    )
    state = _state(registry)
    assert (state.capacity_bytes_per_s, state.capacity_basis) == (2e9, "configured")


def test_the_highest_live_process_estimate_counts_and_a_silent_one_expires() -> None:
    registry = make_registry()
    register_all(registry)
    ep = NodeEndpoint(node="pf1", site="remote", role="prefill", host="mem", http_port=1)
    registry.register(Registration(process="pf1", nodes=[ep]), 0.0)

    def beat(process: str, at_s: float, estimate: float) -> None:
        r = NodeReport(node=process, site="remote", role="prefill")
        link = link_report(capacity_bytes_per_s=estimate, basis="measured")
        assert registry.heartbeat(Heartbeat(process=process, reports=[r], links=[link]), at_s)

    beat("pf0", 0.1, 1e9)
    beat("pf1", 0.2, 4e9)
    assert _state(registry).capacity_bytes_per_s == 4e9
    timeout = registry.deployment.gateway.heartbeat_timeout_s
    beat("pf0", 0.3 + timeout, 1e9)  # pf1 has said nothing for longer than the timeout
    assert _state(registry).capacity_bytes_per_s == 1e9


def test_the_policy_view_holds_the_measured_capacity() -> None:
    """The tuner and router read ``capacity_bytes_per_s`` off this view: the estimate."""
    registry = make_registry()
    register_all(registry)
    heartbeat(registry, "pf0", 0.1, link_report(capacity_bytes_per_s=5e8, basis="measured"))
    link = registry.view.link(SiteId("remote"), SiteId("pd"))
    assert link is not None and link.capacity_bytes_per_s == 5e8
