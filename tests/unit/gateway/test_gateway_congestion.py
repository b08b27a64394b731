"""The live gateway's link state applies ``core.CongestionRule`` to what it measures: goodput over
the senders' paced capacity, egress backlog over capacity, and the worst retransmit rate the nodes'
transfer monitors report."""

from __future__ import annotations

import pytest
from gateway_fakes import heartbeat, make_registry, register_all

from prfaas.core import CongestionRule, LinkState
from prfaas.serve.gateway.registry import NodeRegistry

CAPACITY = 1e6
"""Modelled bytes/s the PrfaaS sender reports it is paced at."""


def _link_after(changes: list[dict[str, object]]) -> tuple[NodeRegistry, LinkState]:
    """The PrfaaS link after pf0's heartbeats, one modelled second apart."""
    registry = make_registry()
    register_all(registry)
    step_wall_s = registry.time_scale
    for i, change in enumerate(changes):
        beat = {"link_capacity_bytes_per_s": CAPACITY, **change}
        assert heartbeat(registry, "pf0", i * step_wall_s, **beat)
    (state,) = registry.link_states()
    return registry, state


def _payload_bytes(registry: NodeRegistry, modelled_bytes: float) -> int:
    return int(modelled_bytes / registry.byte_divisor)


@pytest.mark.timeout(30)
def test_calm_link_is_not_congested() -> None:
    _, state = _link_after([{}, {"link_retransmit_rate": 0.02}])
    assert state.retransmit_rate == 0.02 and not state.congested  # at the threshold, not over


@pytest.mark.timeout(30)
def test_loss_alone_congests() -> None:
    _, state = _link_after([{}, {"link_retransmit_rate": 0.03}])
    assert state.utilisation == 0.0 and state.congested


@pytest.mark.timeout(30)
def test_backlog_alone_congests() -> None:
    probe = make_registry()
    _, state = _link_after([{"egress_backlog_bytes": _payload_bytes(probe, 2 * CAPACITY)}])
    assert state.drain_time_s() == pytest.approx(2.0) and state.congested


@pytest.mark.timeout(30)
def test_utilisation_alone_congests() -> None:
    probe = make_registry()
    # One modelled second of egress at 3.2 x capacity: the smoothed goodput (0.3 of it) is 96%.
    sent = _payload_bytes(probe, 3.2 * CAPACITY)
    _, state = _link_after([{"egress_bytes": 0}, {"egress_bytes": sent}])
    assert state.utilisation == pytest.approx(0.96) and state.backlog_bytes == 0
    assert state.congested
    assert state.congested == CongestionRule().congested(state.utilisation, state.drain_time_s())
    _, half = _link_after([{"egress_bytes": 0}, {"egress_bytes": sent // 2}])
    assert half.utilisation == pytest.approx(0.48) and not half.congested
