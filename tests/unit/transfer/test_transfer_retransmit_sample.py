"""The transfer monitor's retransmit rate counts only over enough segments: one retransmission
among an emulated link's ~100 loopback segments is not 1-9% loss on the modelled link."""

from __future__ import annotations

import pytest

from prfaas.core import CongestionRule, LinkId
from prfaas.transfer.monitor import MIN_RETRANSMIT_SEGMENTS, LinkSample, link_state


def _sample(at_s: float, retrans: int, segs: int) -> LinkSample:
    return LinkSample(at_s, 0, 0, retrans, segs, 0.0, 0.0)


@pytest.mark.timeout(10)
def test_a_few_retransmissions_among_few_segments_are_not_measured() -> None:
    few = MIN_RETRANSMIT_SEGMENTS - 1
    state = link_state(LinkId("a->b"), 1e8, _sample(0.0, 0, 0), _sample(1.0, 5, few),
                       CongestionRule())  # fmt: skip
    assert state.retransmit_rate == 0.0 and not state.congested


@pytest.mark.timeout(10)
def test_the_same_share_over_enough_segments_congests() -> None:
    n = MIN_RETRANSMIT_SEGMENTS
    state = link_state(LinkId("a->b"), 1e8, _sample(0.0, 0, 0), _sample(1.0, n // 20, n),
                       CongestionRule())  # fmt: skip
    assert state.retransmit_rate == pytest.approx((n // 20) / n) and state.congested
