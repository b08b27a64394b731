"""The one congestion rule (``core.CongestionRule``) and the producers that apply it: the transfer
monitor (TCP_INFO and counters), the simulator's link model and the router's scarcity test. The
live gateway's use is in ``gateway/test_gateway_congestion.py``."""

from __future__ import annotations

import math

import pytest

from prfaas.core import CongestionRule, LinkId, LinkState, SiteId
from prfaas.policy.router import BandwidthAwareRouter, BandwidthRules
from prfaas.sim.link import Flow, SimLink
from prfaas.transfer.monitor import LinkSample, link_state

RULE = CongestionRule()


def test_defaults_are_the_thresholds_every_producer_used() -> None:
    assert (RULE.max_utilisation, RULE.max_drain_s) == (0.9, 1.0)
    assert (RULE.max_retransmit_rate, RULE.max_queueing_s, RULE.queueing_fraction) == (
        0.02, 0.02, 0.5,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("measures", "congested"),
    [
        ({"utilisation": 0.0, "drain_s": 0.0}, False),
        ({"utilisation": 0.9, "drain_s": 1.0, "retransmit_rate": 0.02, "queueing_s": 0.02}, False),
        ({"utilisation": 0.91, "drain_s": 0.0}, True),
        ({"utilisation": 0.0, "drain_s": 1.01}, True),
        ({"utilisation": 0.0, "drain_s": math.inf}, True),
        ({"utilisation": 0.0, "drain_s": 0.0, "retransmit_rate": 0.03}, True),
        ({"utilisation": 0.0, "drain_s": 0.0, "queueing_s": 0.021}, True),
        # Queueing threshold: max(20 ms, half the min RTT): 40 ms on a 100 ms path is not a queue.
        ({"utilisation": 0.0, "drain_s": 0.0, "queueing_s": 0.04, "min_rtt_s": 0.1}, False),
        ({"utilisation": 0.0, "drain_s": 0.0, "queueing_s": 0.06, "min_rtt_s": 0.1}, True),
    ],
)
def test_any_measure_over_its_threshold_congests(
    measures: dict[str, float], congested: bool
) -> None:
    assert RULE.congested(**measures) is congested


def test_thresholds_are_fields() -> None:
    strict = CongestionRule(max_utilisation=0.5, max_drain_s=0.1)
    assert strict.congested(0.6, 0.0) and strict.congested(0.0, 0.2)
    assert not strict.congested(0.5, 0.1)


def _sample(at: float, acked: int, backlog: int = 0) -> LinkSample:
    return LinkSample(at, acked, backlog, 0, 1000, 0.05, 0.05)


def test_monitor_applies_the_rule_to_all_it_measures() -> None:
    prev = _sample(0.0, 0)
    busy = link_state(LinkId("a->b"), 1e8, prev, _sample(1.0, 95_000_000), RULE)
    assert busy.utilisation == pytest.approx(0.95) and busy.congested  # utilisation alone
    calm = link_state(LinkId("a->b"), 1e8, prev, _sample(1.0, 50_000_000), RULE)
    assert not calm.congested
    lenient = CongestionRule(max_utilisation=1.0)
    assert not link_state(LinkId("a->b"), 1e8, prev, _sample(1.0, 95_000_000), lenient).congested


def _sim_link(capacity: float) -> SimLink:
    def schedule(_t: float, _f: Flow, _v: int) -> None:
        pass

    return SimLink(LinkId("a->b"), capacity, 0.0, 1, 1e18, schedule)


def test_sim_link_applies_the_rule_to_utilisation_and_drain() -> None:
    link = _sim_link(100.0)
    assert not link.state(0.0).congested  # idle
    link.add(0.0, 1000.0, 0.0, "f", 1)  # 10 s at the full 100 B/s
    start = link.state(0.0)
    assert start.drain_time_s() == pytest.approx(10.0) and start.congested  # drain alone
    late = link.state(9.5)  # 50 bytes left (0.5 s), goodput ~ capacity: utilisation alone
    assert late.drain_time_s() == pytest.approx(0.5) and late.utilisation > 0.9
    assert late.congested
    assert late.congested == RULE.congested(late.utilisation, late.drain_time_s())
    assert not _sim_link(100.0).state(1.0).congested
    dead = _sim_link(0.0).state(1.0)  # no capacity: nothing ever drains
    assert dead.congested


def test_router_reads_the_flag_and_applies_the_rule_at_its_own_thresholds() -> None:
    router = BandwidthAwareRouter(SiteId("pd"), [SiteId("far")], BandwidthRules())

    def link(**kw: float | int | bool) -> LinkState:
        return LinkState(LinkId("far->pd"), 1000.0, **kw)  # type: ignore[arg-type]

    assert not router.is_scarce(None)
    assert not router.is_scarce(link(utilisation=0.85, backlog_bytes=1000))  # at, not over
    assert router.is_scarce(link(utilisation=0.86))  # earlier than congestion (0.9)
    assert router.is_scarce(link(backlog_bytes=1001))
    assert router.is_scarce(link(congested=True))  # the producer's verdict (e.g. loss)
    assert not router.is_scarce(link(retransmit_rate=0.5))  # loss counts only via the flag
