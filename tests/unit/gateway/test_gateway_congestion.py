"""The live gateway's link state applies ``core.CongestionRule`` to what it measures: goodput over
the senders' paced capacity, egress backlog over capacity, and the worst retransmit rate the nodes'
transfer monitors report."""

from __future__ import annotations

import math

import pytest
from gateway_fakes import heartbeat, link_report, make_registry, register_all

from prfaas.core import CongestionRule, LinkState
from prfaas.core.link_estimate import GOODPUT_EWMA_S, DeliveredRate
from prfaas.serve.gateway.registry import NodeRegistry

CAPACITY = 1e6
"""Modelled bytes/s the PrfaaS sender reports it is paced at."""


def _link_after(changes: list[dict[str, object]]) -> tuple[NodeRegistry, LinkState]:
    """The PrfaaS link after pf0's heartbeats, one modelled second apart."""
    registry = make_registry()
    register_all(registry)
    step_wall_s = registry.time_scale
    for i, change in enumerate(changes):
        beat = dict(change)
        link = {"configured_bytes_per_s": CAPACITY, **beat.pop("link", {})}  # type: ignore[dict-item]
        assert heartbeat(registry, "pf0", i * step_wall_s, link_report(**link), **beat)
    (state,) = registry.link_states()
    return registry, state


def _payload_bytes(registry: NodeRegistry, modelled_bytes: float) -> int:
    return int(modelled_bytes / registry.byte_divisors["remote"])


@pytest.mark.timeout(30)
def test_calm_link_is_not_congested() -> None:
    _, state = _link_after([{}, {"link": {"retransmit_rate": 0.02}}])
    assert state.retransmit_rate == 0.02 and not state.congested  # at the threshold, not over


@pytest.mark.timeout(30)
def test_loss_alone_congests() -> None:
    _, state = _link_after([{}, {"link": {"retransmit_rate": 0.03}}])
    assert state.utilisation == 0.0 and state.congested


@pytest.mark.timeout(30)
def test_backlog_alone_congests() -> None:
    probe = make_registry()
    _, state = _link_after([{"egress_backlog_bytes": _payload_bytes(probe, 2 * CAPACITY)}])
    assert state.drain_time_s() == pytest.approx(2.0) and state.congested


@pytest.mark.timeout(30)
def test_utilisation_alone_congests() -> None:
    probe = make_registry()
    # One modelled second of egress at 3.2 x capacity: the goodput filter (time constant 2 s,
    # the simulator's link's) takes 1 - e^-0.5 of it: utilisation 1.26.
    sent = _payload_bytes(probe, 3.2 * CAPACITY)
    _, state = _link_after([{"egress_bytes": 0}, {"egress_bytes": sent}])
    share = 1 - math.exp(-1 / GOODPUT_EWMA_S)
    assert state.utilisation == pytest.approx(3.2 * share) and state.backlog_bytes == 0
    assert state.congested
    assert state.congested == CongestionRule().congested(state.utilisation, state.drain_time_s())
    _, low = _link_after([{"egress_bytes": 0}, {"egress_bytes": sent // 4}])
    assert low.utilisation == pytest.approx(0.8 * share) and not low.congested


@pytest.mark.timeout(30)
def test_goodput_is_the_simulators_filter_over_delivered_bytes() -> None:
    """Same delivery history, same goodput as the simulator's link computes: bytes the senders
    accepted (credited per piece) less those not yet acknowledged, through ``DeliveredRate``."""
    probe = make_registry()
    accepted = [0, 3e6, 5e6, 5e6, 9e6]
    unacked = [0, 1e6, 2e6, 0, 1e6]
    beats: list[dict[str, object]] = [
        {"egress_bytes": _payload_bytes(probe, a),
         "link": {"backlog_bytes": int(u), "basis": "configured",
                  "capacity_bytes_per_s": CAPACITY}}
        for a, u in zip(accepted, unacked, strict=True)
    ]  # fmt: skip
    _, state = _link_after(beats)
    sim = DeliveredRate()
    for i, (a, u) in enumerate(zip(accepted, unacked, strict=True)):
        expected = sim.observe(float(i), a - u)
    assert state.goodput_bytes_per_s == pytest.approx(expected)
    assert state.utilisation == pytest.approx(expected / CAPACITY)
    assert state.backlog_bytes == 1e6


@pytest.mark.timeout(30)
def test_backlog_counts_what_the_nodes_have_not_handed_over() -> None:
    """A transfer counts whole from its first layer (as the simulator's flow does): the nodes'
    unsent bytes plus the senders' unacknowledged ones, both over the capacity in use."""
    probe = make_registry()
    beat = {"egress_backlog_bytes": _payload_bytes(probe, 1.5 * CAPACITY),
            "link": {"backlog_bytes": int(0.5 * CAPACITY), "basis": "configured",
                     "capacity_bytes_per_s": CAPACITY}}  # fmt: skip
    _, state = _link_after([beat])
    assert state.backlog_bytes == pytest.approx(2 * CAPACITY)
    assert state.drain_time_s() == pytest.approx(2.0) and state.congested
