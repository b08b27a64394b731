"""The link capacity estimator (core/link_estimate.py): max-filtered busy goodput, a fluid link."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas.core.link_estimate import (
    CapacityEstimator,
    EstimatorConfig,
    LinkReading,
)

pytestmark = pytest.mark.timeout(60)


class FluidLink:
    """A link of capacity ``c`` bytes/s fed by a sender's queue: per step, it delivers
    min(queue + offered, c * dt) and the rest stays queued."""

    def __init__(self) -> None:
        self.acked = 0.0
        self.queue = 0.0

    def step(self, offered_bytes: float, capacity_bytes_per_s: float, dt_s: float) -> LinkReading:
        have = self.queue + offered_bytes
        delivered = min(have, capacity_bytes_per_s * dt_s)
        self.acked += delivered
        self.queue = have - delivered
        return LinkReading(int(self.acked), int(self.queue))


def _run(
    est: CapacityEstimator, steps: list[tuple[float, float]], dt_s: float = 0.1, t0: float = 0.0
) -> list[float]:
    link = FluidLink()
    est.observe(t0, {"l": LinkReading(0, 0)})
    out = []
    for i, (offered, cap) in enumerate(steps, start=1):
        out.append(est.observe(t0 + i * dt_s, {"l": link.step(offered, cap, dt_s)})
                   .capacity_bytes_per_s)  # fmt: skip
    return out


def test_configured_until_the_first_busy_interval_then_measured() -> None:
    est = CapacityEstimator(1000.0)
    link = FluidLink()
    assert est.observe(0.0, {"l": link.step(0, 500, 0.1)}).basis == "configured"
    # Light load (queue empty): the link carried 20 B/s of a believed 1000: says nothing.
    e = est.observe(0.1, {"l": link.step(2, 500, 0.1)})
    assert (e.basis, e.capacity_bytes_per_s, e.busy) == ("configured", 1000.0, False)
    # Heavy load: the queue builds and stays; the goodput is the link's 500 B/s.
    est.observe(0.2, {"l": link.step(200, 500, 0.1)})
    e = est.observe(0.3, {"l": link.step(200, 500, 0.1)})
    assert e.busy and e.basis == "measured"
    assert e.capacity_bytes_per_s == pytest.approx(500, rel=0.02)


def test_a_drop_shows_after_the_window_and_a_recovery_at_once() -> None:
    cfg = EstimatorConfig(window_s=1.0)
    est = CapacityEstimator(1000.0, cfg)
    # 2 s saturated at 1000 B/s, then 3 s at 200 B/s, then 2 s back at 1000 (still saturated).
    steps = [(150.0, 1000.0)] * 20 + [(150.0, 200.0)] * 30 + [(150.0, 1000.0)] * 20
    caps = _run(est, steps)
    assert caps[19] == pytest.approx(1000, rel=0.02)
    assert caps[22] == pytest.approx(1000, rel=0.02)  # within the window: the old max holds
    assert caps[49] == pytest.approx(200, rel=0.02)  # past it: the lower rate
    assert caps[51] == pytest.approx(1000, rel=0.02)  # a queue drains at the recovered rate


def test_recovery_seen_without_a_queue_when_goodput_exceeds_the_estimate() -> None:
    est = CapacityEstimator(1000.0, EstimatorConfig(window_s=1.0))
    # Saturated at 200 B/s for 2 s, then the link recovers and the load (600 B/s) fits in it.
    caps = _run(est, [(60.0, 200.0)] * 20 + [(0.0, 200.0)] * 40 + [(60.0, 5000.0)] * 30)
    assert caps[19] == pytest.approx(200, rel=0.02)
    assert caps[59] == pytest.approx(200, rel=0.02)  # idle: the estimate is held
    # The queue is empty after the first recovered interval, yet 600 B/s > 200 B/s raises it.
    assert caps[-1] == pytest.approx(600, rel=0.05)


def test_idle_holds_the_estimate_and_light_load_does_not_lower_it() -> None:
    est = CapacityEstimator(1000.0, EstimatorConfig(window_s=0.5))
    caps = _run(est, [(100.0, 500.0)] * 10 + [(0.0, 500.0)] * 30 + [(5.0, 500.0)] * 30)
    assert caps[9] == pytest.approx(500, rel=0.02)
    assert caps[-1] == pytest.approx(500, rel=0.02)


def test_links_appearing_and_replaced_count_only_their_known_bytes() -> None:
    est = CapacityEstimator(10.0, EstimatorConfig(window_s=10.0))
    est.observe(0.0, {"a": LinkReading(1000, 50)})
    e = est.observe(1.0, {"a": LinkReading(1100, 50), "b": LinkReading(10**9, 50)})
    assert e.goodput_bytes_per_s == pytest.approx(100)  # b's history is not this interval's
    e = est.observe(2.0, {"a": LinkReading(20, 50), "b": LinkReading(10**9 + 300, 50)})
    assert e.goodput_bytes_per_s == pytest.approx(300)  # a was replaced: its new bytes unknown
    assert e.capacity_bytes_per_s == pytest.approx(300) and e.basis == "measured"


def test_queue_and_rtt_over_the_links() -> None:
    est = CapacityEstimator(10.0)
    e = est.observe(0.0, {"a": LinkReading(0, 7, 0.01), "b": LinkReading(0, 5, 0.03)})
    assert (e.queue_bytes, e.rtt_s) == (12, 0.03)


def test_configured_rate_change_stands_until_measured_only() -> None:
    est = CapacityEstimator(1000.0)
    est.set_configured(2000.0)
    assert est.latest.capacity_bytes_per_s == 2000.0
    _run(est, [(100.0, 500.0)] * 5)
    est.set_configured(4000.0)
    assert est.latest.capacity_bytes_per_s == pytest.approx(500, rel=0.05)


@pytest.mark.parametrize(
    "kwargs", [{"window_s": 0}, {"busy_queue_bytes": 0}, {"min_interval_s": 0}]
)
def test_bad_config(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        EstimatorConfig(**kwargs)  # type: ignore[arg-type]


_step = st.tuples(st.floats(0, 400), st.sampled_from([100.0, 300.0, 1000.0, 2500.0]))


@settings(max_examples=150, deadline=None)
@given(st.lists(_step, min_size=1, max_size=120), st.floats(0.05, 0.5))
def test_never_above_the_link_and_never_below_a_busy_sample(
    steps: list[tuple[float, float]], dt_s: float
) -> None:
    """Every measured estimate is a goodput the link delivered (so at most the highest capacity it
    had), and at least every busy goodput still in the window."""
    cfg = EstimatorConfig(window_s=1.0)
    est = CapacityEstimator(50.0, cfg)
    link = FluidLink()
    est.observe(0.0, {"l": LinkReading(0, 0)})
    history: list[tuple[float, float, bool]] = []
    for i, (offered, cap) in enumerate(steps, start=1):
        now = i * dt_s
        e = est.observe(now, {"l": link.step(offered * dt_s * 10, cap, dt_s)})
        history.append((now, e.goodput_bytes_per_s, e.busy))
        if e.basis == "measured":
            # +1 byte per interval: the readings are whole bytes.
            assert e.capacity_bytes_per_s <= max(c for _, c in steps[:i]) + 1 / dt_s
        for at, goodput, busy in history:
            if busy and at >= now - cfg.window_s:
                assert e.capacity_bytes_per_s >= goodput - 1e-9


@settings(max_examples=100, deadline=None)
@given(
    st.lists(_step, max_size=40),
    st.sampled_from([100.0, 300.0, 1000.0]),
    st.floats(0.05, 0.3),
)
def test_a_saturated_window_measures_the_link(
    before: list[tuple[float, float]], cap: float, dt_s: float
) -> None:
    """Whatever came before, a window and more of saturation at ``cap`` gives ``cap``."""
    cfg = EstimatorConfig(window_s=1.0)
    est = CapacityEstimator(50.0, cfg)
    n = int(cfg.window_s / dt_s) + 3
    caps = _run(est, [*before, (cap * dt_s * 2 + 10_000, cap)] + [(cap * dt_s * 2, cap)] * n,
                dt_s)  # fmt: skip
    assert caps[-1] == pytest.approx(cap, rel=0.01, abs=2 / dt_s)
