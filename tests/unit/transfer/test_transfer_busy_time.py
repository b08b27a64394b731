"""The sender's busy-time accounting (transfer/sender.py, transfer/pacing.py): how much of the
time the pacer or the socket, not the producer, held the link back. Runs on an event loop whose
clock jumps to the next timer (exact, no wall time)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jumping_clock import run_virtual
from prfaas.spec import CacheSpec, DType, LayerCache
from prfaas.transfer import Link, LinkCounters, Manifest, Receiver, TransferConfig
from prfaas.transfer.pacing import TokenBucket, link_burst_bytes
from transfer_helpers import KEY, Allocator

pytestmark = pytest.mark.timeout(60)


RATE = 100_000.0  # payload bytes/s
PIECE = 4096
SPEC = CacheSpec(tuple(LayerCache.gqa(1, 16, DType.FP32) for _ in range(1)))


async def _paced(
    produce: Callable[[Any], Coroutine[Any, Any, None]], rate: float | None = RATE
) -> tuple[LinkCounters, LinkCounters, float, float]:
    """Counters before and after ``produce(session)`` (and the loop times), over memory."""
    cfg = TransferConfig(psk=KEY, num_connections=2, chunk_bytes=PIECE,
                         rate_limit_bytes_per_s=rate, timeout_s=60)  # fmt: skip
    loop = asyncio.get_running_loop()
    async with Receiver(cfg, Allocator()) as rx:
        link = await Link.in_memory(rx, cfg)
        async with link:
            layout = SPEC.layout(PIECE * 40 // SPEC.layers[0].bytes_per_token, 0)
            manifest = Manifest.from_layout("r", layout)
            c0, t0 = link.counters(), loop.time()
            async with link.session(manifest) as s:
                await produce(s)
                t1 = loop.time()
                c1 = link.counters()
                await s.finish()
            inbound = await rx.next_session()
            await inbound.complete()
    return c0, c1, t0, t1


def _pieces(manifest: Manifest) -> list[tuple[int, int]]:
    n = manifest.layers[0].num_bytes
    return [(off, min(PIECE, n - off)) for off in range(0, n, PIECE)]


def test_oversupply_is_pacer_limited_throughout() -> None:
    """40 pieces queued at once at 100 kB/s: the pacer holds them back until the last is out;
    the whole time is backlogged and pacer-limited, none of it write-blocked (memory)."""

    async def main() -> None:
        async def produce(s: Any) -> None:
            buf = bytes(s.manifest.layers[0].num_bytes)
            for off, n in _pieces(s.manifest):
                await s.send(0, off, memoryview(buf)[off : off + n])
            while s.bytes_sent < len(buf):
                await asyncio.sleep(0.01)

        c0, c1, t0, t1 = await _paced(produce)
        elapsed = t1 - t0
        # The burst (16 KiB) leaves at once; the rest at the rate.
        assert elapsed == pytest.approx((40 * PIECE - 16 * 1024) / RATE, abs=0.02)
        assert c1.pacer_limited_s - c0.pacer_limited_s == pytest.approx(elapsed, abs=0.02)
        assert c1.backlogged_s - c0.backlogged_s == pytest.approx(elapsed, abs=0.02)
        assert c1.link_limited_s == pytest.approx(c1.pacer_limited_s)

    run_virtual(main())


def test_a_producer_slower_than_the_rate_is_never_pacer_limited() -> None:
    """A piece every 0.1 s (41 kB/s) under a 100 kB/s pacer: it never waits for tokens, so the
    time is app-limited (nothing backlogged beyond the instant of a write)."""

    async def main() -> None:
        async def produce(s: Any) -> None:
            buf = bytes(s.manifest.layers[0].num_bytes)
            for off, n in _pieces(s.manifest):
                await s.send(0, off, memoryview(buf)[off : off + n])
                await asyncio.sleep(0.1)

        c0, c1, t0, t1 = await _paced(produce)
        assert t1 - t0 == pytest.approx(4.0, abs=0.05)
        assert c1.pacer_limited_s - c0.pacer_limited_s == 0.0
        assert c1.backlogged_s - c0.backlogged_s < 0.01

    run_virtual(main())


def test_unpaced_memory_link_is_never_pacer_limited() -> None:
    async def main() -> None:
        async def produce(s: Any) -> None:
            buf = bytes(s.manifest.layers[0].num_bytes)
            for off, n in _pieces(s.manifest):
                await s.send(0, off, memoryview(buf)[off : off + n])
            await asyncio.sleep(1.0)

        _, c1, _, _ = await _paced(produce, rate=None)
        assert c1.pacer_limited_s == 0.0 and c1.backlogged_s < 0.01

    run_virtual(main())


def _union_s(spans: list[tuple[float, float]], now_s: float) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        b = min(b, now_s)
        if b <= a:
            continue
        a = max(a, end)
        if b > a:
            total += b - a
            end = b
    return total


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 5000)), min_size=1, max_size=60),
    st.floats(0, 2.0),
)
def test_throttled_time_is_the_union_of_the_waits(
    steps: list[tuple[float, int]], tail_s: float
) -> None:
    """``throttled_s`` is exactly the time some reserved bytes were waiting for tokens: the union
    of every reservation's [reserve time, reserve time + wait), up to now."""
    bucket = TokenBucket(rate_bytes_per_s=10_000.0, burst_bytes=1000.0, now_s=0.0)
    now, spans = 0.0, []
    for gap, n in steps:
        now += gap
        wait = bucket.reserve(n, now)
        spans.append((now, now + wait))
        assert bucket.throttled_s(now) == pytest.approx(_union_s(spans, now), abs=1e-9)
    end = now + tail_s
    assert bucket.throttled_s(end) == pytest.approx(_union_s(spans, end), abs=1e-9)
    assert bucket.throttled_s(end) <= end + 1e-12


def test_a_rate_change_moves_the_end_of_the_debt() -> None:
    bucket = TokenBucket(rate_bytes_per_s=1000.0, burst_bytes=100.0, now_s=0.0)
    assert bucket.reserve(1100, 0.0) == pytest.approx(1.0)
    bucket.set_rate(2000.0, 100.0, 0.5)  # 500 bytes of debt left: it clears in 0.25 s now
    assert bucket.throttled_s(10.0) == pytest.approx(0.75)


def test_a_rate_change_takes_the_new_rates_burst() -> None:
    """A bucket idle at 10 Gbit/s holds its 12.5 MB burst; re-rated to 8 Mbit/s it keeps only the
    new burst: 2 MB then wait ~2 s of the new rate, not leave at once (found live: a link
    re-paced by ``/link/rate`` let the next 3.6 MB out unpaced)."""
    fast = 10e9 / 8
    bucket = TokenBucket(fast, link_burst_bytes(fast), now_s=0.0)
    slow = 8e6 / 8
    bucket.set_rate(slow, link_burst_bytes(slow), 1.0)
    wait = bucket.reserve(2_000_000, 1.0)
    assert wait == pytest.approx((2_000_000 - link_burst_bytes(slow)) / slow)
    assert bucket.throttled_s(1.0 + wait) == pytest.approx(wait)
