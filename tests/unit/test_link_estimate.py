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


def test_a_link_that_carries_nothing_is_probed_up_toward_the_configured_rate() -> None:
    """A measured estimate below the configured rate on a link that carries nothing (the tuner's
    threshold, set by that low estimate, keeps every request off it) steps up by ``probe_gain``
    each ``probe_after_s`` of quiet, to the configured rate at most; the first link-limited span
    after a step measures the link again; traffic below the estimate holds it (no step)."""
    cfg = EstimatorConfig(window_s=1.0, probe_after_s=5.0, probe_gain=2.0)
    est = CapacityEstimator(1000.0, cfg)
    # 1 s offered at 300 B/s to a 100 B/s link (its 200 B queue drains by 3 s), then 22 s of
    # nothing crossing (0.1 s observations).
    caps = _run(est, [(30.0, 100.0)] * 10 + [(0.0, 100.0)] * 240)
    assert caps[9] == pytest.approx(100, rel=0.02)
    assert caps[75] == pytest.approx(100, rel=0.02)  # under 5 s of quiet: held
    assert caps[85] == pytest.approx(200, rel=0.02)  # one step (at 8 s)
    assert caps[135] == pytest.approx(400, rel=0.02)  # the next, 5 s later
    assert caps[-1] == pytest.approx(1000)  # 800, then capped at the configured rate
    # The link is still at 100 B/s: the load that the stepped-up estimate lets through queues
    # and the first link-limited spans past the window read 100 again.
    est = CapacityEstimator(1000.0, cfg)
    caps = _run(est, [(30.0, 100.0)] * 10 + [(0.0, 100.0)] * 80 + [(30.0, 100.0)] * 20)
    assert caps[85] == pytest.approx(200, rel=0.02)
    assert caps[-1] == pytest.approx(100, rel=0.02)
    # Light traffic that crosses (below the estimate) is no quiet: held, never stepped.
    est = CapacityEstimator(1000.0, cfg)
    caps = _run(est, [(30.0, 100.0)] * 10 + [(2.0, 100.0)] * 200)
    assert caps[-1] == pytest.approx(100, rel=0.02)


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
    "kwargs",
    [
        {"window_s": 0},
        {"busy_queue_bytes": 0},
        {"min_interval_s": 0},
        {"probe_after_s": 2.0},
        {"probe_gain": 1.0},
    ],
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


# -- the app-limited rule: only spans the link held the sender back lower or hold the estimate ----


class PacedLink:
    """A sender paced at ``c`` bytes/s: per substep it sends min(queue, c * dt) and counts the
    substep as link-limited (``link_limited_s``) only when the pacer, not the queue, was the
    limit. The network queue is 0: the pacer is the bottleneck, the kernel holds nothing."""

    SUBSTEPS = 10

    def __init__(self) -> None:
        self.acked = 0.0
        self.queue = 0.0
        self.limited_s = 0.0

    def step(self, offered_bytes: float, capacity_bytes_per_s: float, dt_s: float) -> LinkReading:
        sub = dt_s / self.SUBSTEPS
        for _ in range(self.SUBSTEPS):
            self.queue += offered_bytes / self.SUBSTEPS
            room = capacity_bytes_per_s * sub
            if self.queue >= room:
                self.limited_s += sub
            sent = min(self.queue, room)
            self.acked += sent
            self.queue -= sent
        return LinkReading(int(self.acked), int(self.queue), 0.0, self.limited_s, 0)


def _readings(link_limited_s: float, acked: int, queue: int) -> dict[str, LinkReading]:
    return {"l": LinkReading(acked, queue, 0.0, link_limited_s, network_queue_bytes=0)}


def test_a_queue_at_both_ends_of_an_app_limited_span_does_not_lower_the_estimate() -> None:
    est = CapacityEstimator(1000.0, EstimatorConfig(window_s=1.0))
    est.observe(0.0, _readings(0.0, 0, 0))
    # Limited throughout at 1000 B/s: measured.
    e = est.observe(1.0, _readings(1.0, 1000, 500))
    assert (e.busy, e.capacity_bytes_per_s, e.limited_fraction) == (True, 1000.0, 1.0)
    # Bursty production: a queue stands at both instants, but the pacer held the sender back
    # for only half the span; 400 B/s says what the producer offered, not what the link gives.
    e = est.observe(2.0, _readings(1.5, 1400, 500))
    assert not e.busy and e.limited_fraction == pytest.approx(0.5)
    e = est.observe(3.5, _readings(1.5, 1500, 500))
    assert e.capacity_bytes_per_s == 1000.0  # held past the window: nothing lowered it
    # Limited for 95% of a span: it measures the link, which is now slower.
    e = est.observe(4.5, _readings(2.45, 1800, 500))
    assert e.busy and e.capacity_bytes_per_s == pytest.approx(300)


def test_a_queue_only_the_sender_process_holds_does_not_count_as_busy() -> None:
    """A process starved of CPU leaves its own queue standing while the link idles: only the
    network's queue (``network_queue_bytes``) can prove the link was the limit."""
    est = CapacityEstimator(1000.0)
    est.observe(0.0, {"l": LinkReading(0, 10_000, 0.0, 0.0, network_queue_bytes=0)})
    e = est.observe(1.0, {"l": LinkReading(100, 10_000, 0.0, 0.0, network_queue_bytes=0)})
    assert not e.busy and e.basis == "configured"
    # The same span with the kernel's queue covering all delivered bytes: the network was busy.
    est = CapacityEstimator(1000.0)
    est.observe(0.0, {"l": LinkReading(0, 10_000, 0.0, 0.0, network_queue_bytes=10_000)})
    e = est.observe(1.0, {"l": LinkReading(100, 10_000, 0.0, 0.0, network_queue_bytes=9_900)})
    assert e.busy and e.capacity_bytes_per_s == pytest.approx(100)


def test_spans_end_at_every_observation_so_an_unaligned_busy_stretch_is_measured() -> None:
    """0.65 s of saturation between idle stretches, observed every 0.1 s: a 0.5 s span lies
    inside it, although on a 0.5 s grid from the first call no interval would."""
    est = CapacityEstimator(5000.0, EstimatorConfig(window_s=3.0, min_interval_s=0.5))
    link = PacedLink()
    est.observe(0.0, {"l": link.step(0.0, 1000.0, 0.1)})
    offered = [0.0] * 2 + [200.0] * 7 + [0.0] * 10  # 2000 B/s offered for 0.7 s
    busy = []
    for i, n in enumerate(offered, start=1):
        e = est.observe(i * 0.1, {"l": link.step(n, 1000.0, 0.1)})
        busy.append(e.busy)
    assert any(busy)
    assert e.capacity_bytes_per_s == pytest.approx(1000, rel=0.02)
    assert e.basis == "measured"


def test_bad_busy_fraction() -> None:
    with pytest.raises(ValueError, match="busy_fraction"):
        EstimatorConfig(busy_fraction=0)
    with pytest.raises(ValueError, match="busy_fraction"):
        EstimatorConfig(busy_fraction=1.5)


_paced_step = st.tuples(st.floats(0, 300), st.sampled_from([200.0, 1000.0]))


@settings(max_examples=150, deadline=None)
@given(st.lists(_paced_step, min_size=1, max_size=100), st.floats(0.05, 0.3))
def test_a_paced_link_reads_between_busy_fraction_and_its_rate(
    steps: list[tuple[float, float]], dt_s: float
) -> None:
    """Any offered load (bursty or not) on a link paced at ``c`` (changing): every link-limited
    span's goodput is between ``busy_fraction * c_min`` and ``c_max`` of the span; until a span
    is link-limited, app-limited spans only ever raise the estimate."""
    cfg = EstimatorConfig(window_s=1.0, min_interval_s=0.2)
    est = CapacityEstimator(50.0, cfg)
    link = PacedLink()
    est.observe(0.0, {"l": link.step(0.0, 1.0, dt_s)})
    caps: list[tuple[float, float]] = []
    before, any_busy = est.latest.capacity_bytes_per_s, False
    for i, (offered, cap) in enumerate(steps, start=1):
        now = i * dt_s
        e = est.observe(now, {"l": link.step(offered * dt_s * 10, cap, dt_s)})
        caps.append((now, cap))
        # Whole bytes: a reading is off by < 1 byte at each end.
        slack = 2 / e.span_s if e.span_s else 0.0
        in_span = [c for at, c in caps if now - e.span_s - 1e-9 < at]
        if e.busy:
            any_busy = True
            assert cfg.busy_fraction * min(in_span) - slack <= e.goodput_bytes_per_s
            assert e.goodput_bytes_per_s <= max(in_span) + slack
        if not any_busy:
            assert e.capacity_bytes_per_s >= before
        before = e.capacity_bytes_per_s
