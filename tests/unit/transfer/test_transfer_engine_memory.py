"""The asyncio engine over the in-memory transport: delivery, refusal, faults, cancellation."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prfaas.transfer import (
    AbortCode,
    ConnectError,
    Link,
    Receiver,
    SessionAborted,
    SessionState,
    TransferConfig,
)
from prfaas.transfer import frames as F
from prfaas.transfer.channel import MemoryChannel
from transfer_helpers import (
    KEY,
    Allocator,
    random_manifest,
    random_payload,
    random_ranges,
    send_all,
)

pytestmark = pytest.mark.timeout(60)
CFG = TransferConfig(psk=KEY, num_connections=3, chunk_bytes=4096, timeout_s=5)


async def _roundtrip(seed: int, cfg: TransferConfig, num_sessions: int = 2) -> None:
    rng = random.Random(seed)
    alloc = Allocator()
    async with Receiver(cfg, alloc) as rx:
        link = await Link.in_memory(rx, cfg, rng=random.Random(seed + 1))
        async with link:
            jobs = []
            for k in range(num_sessions):
                m = random_manifest(rng, f"req-{k}")
                payload = random_payload(rng, m)
                jobs.append((m, payload, random_ranges(rng, payload)))

            async def one(m, payload, pieces):  # type: ignore[no-untyped-def]
                async with link.session(m) as s:
                    await send_all(s, payload, pieces, first=len(pieces))

            async with asyncio.TaskGroup() as tg:
                for job in jobs:
                    tg.create_task(one(*job))
            got = {}
            for _ in jobs:
                ins = await rx.next_session()
                d = await ins.complete()
                got[d.request_id] = d
            for m, payload, pieces in jobs:
                d = got[m.request_id]
                assert d.manifest == m and d.first_token == len(pieces)
                assert [bytes(b) for b in d.buffers] == payload
            assert link.counters().backlog_bytes == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), conns=st.integers(1, 4), chunk=st.sampled_from([4096, 65536]))
def test_random_manifests_arrive_byte_exact(seed: int, conns: int, chunk: int) -> None:
    cfg = dataclasses.replace(CFG, num_connections=conns, chunk_bytes=chunk)
    asyncio.run(_roundtrip(seed, cfg))


async def test_layers_are_announced_before_the_session_completes() -> None:
    rng = random.Random(3)
    m = random_manifest(rng)
    while m.num_layers < 2 or 0 in m.layer_bytes():
        m = random_manifest(rng)
    payload = random_payload(rng, m)
    async with Receiver(CFG, Allocator()) as rx, await Link.in_memory(rx, CFG) as link:
        async with link.session(m) as s:
            ins = await rx.next_session()
            await s.send(0, 0, payload[0])
            layer0 = await ins.layer(0)
            assert bytes(layer0) == payload[0]
            assert ins.state is SessionState.STREAMING  # not handed over yet
            for i in range(1, m.num_layers):
                await s.send(i, 0, payload[i])
            await s.finish(first_token=9)
        assert (await ins.complete()).first_token == 9


async def test_refusal_aborts_before_any_payload() -> None:
    m = random_manifest(random.Random(1))
    alloc = Allocator(refuse="over KV budget: 3 GiB free")
    async with Receiver(CFG, alloc) as rx, await Link.in_memory(rx, CFG) as link:
        with pytest.raises(SessionAborted) as info:
            async with link.session(m):
                pytest.fail("a refused session must not open")
        assert info.value.code is AbortCode.REFUSED and info.value.by_peer
        assert "over KV budget" in info.value.reason
        assert rx.bytes_verified == 0 and len(alloc.calls) == 1


async def test_oversize_manifest_refused_without_allocating() -> None:
    m = random_manifest(random.Random(2))
    alloc = Allocator()
    cfg = dataclasses.replace(CFG, max_session_bytes=max(1, m.num_bytes - 1))
    async with Receiver(cfg, alloc) as rx, await Link.in_memory(rx, CFG) as link:
        with pytest.raises(SessionAborted) as info:
            await link.open(m)
        assert info.value.code is AbortCode.TOO_LARGE and alloc.calls == []


async def test_wrong_key_refused_and_nothing_allocated() -> None:
    alloc = Allocator()
    async with Receiver(CFG, alloc) as rx:
        bad = dataclasses.replace(CFG, psk=b"not-the-right-key-at-all")
        with pytest.raises(ConnectError, match=r"pre-shared key|auth"):
            await Link.in_memory(rx, bad)
        await asyncio.sleep(0.01)
        assert alloc.calls == [] and rx.bytes_verified == 0
        assert rx.num_handshake_failures >= 1


def _tamper(link: Link, f):  # type: ignore[no-untyped-def]
    for ch in link._channels:
        assert isinstance(ch, MemoryChannel)
        ch.tamper.append(f)


def _is_chunk(data: bytes) -> bool:
    return len(data) > 48 and data[:2] == F.MAGIC and data[3] == F.FrameType.CHUNK


def _once(f):  # type: ignore[no-untyped-def]
    """Apply ``f`` to the first chunk written, then pass everything through."""
    done = []

    def tamper(data: bytes) -> bytes:
        if done or not _is_chunk(data):
            return data
        done.append(True)
        return f(data)  # type: ignore[no-any-return]

    return tamper


def _flip_last_byte(data: bytes) -> bytes:
    raw = bytearray(data)
    raw[-1] ^= 0xFF  # the last payload byte of the write
    return bytes(raw)


async def _one_tampered_chunk(tamper, expect: set[AbortCode]) -> None:  # type: ignore[no-untyped-def]
    """One chunk of session "bad" is tampered with on the wire: that session is refused before
    it is handed over (``expect`` says how); the tampered connection is closed, failing its link
    and the other session on it with a reason; a fresh link is then served as usual."""
    rng = random.Random(7)
    good_m, bad_m = random_manifest(rng, "good"), random_manifest(rng, "bad")
    while bad_m.num_bytes < 100:
        bad_m = random_manifest(rng, "bad")
    good, bad = random_payload(rng, good_m), random_payload(rng, bad_m)
    alloc = Allocator()
    async with Receiver(CFG, alloc) as rx:
        async with await Link.in_memory(rx, CFG) as link:
            s_good = await link.open(good_m)
            s_bad = await link.open(bad_m)
            in_good, in_bad = await rx.next_session(), await rx.next_session()
            _tamper(link, _once(tamper))
            with pytest.raises((SessionAborted, ConnectError)):
                await send_all(s_bad, bad, [(i, 0, len(b)) for i, b in enumerate(bad) if b])
            with pytest.raises(SessionAborted) as got:
                await in_bad.complete()
            assert got.value.code in expect and "bad" in got.value.reason
            assert in_bad.assembly.buffers == ()  # the consumer's memory is left alone
            with pytest.raises(SessionAborted) as other:
                await in_good.complete()
            assert other.value.code is AbortCode.CONNECTION_LOST
            assert "failed its MAC" in other.value.reason
            with pytest.raises((SessionAborted, ConnectError)):
                await send_all(s_good, good, [(i, 0, len(b)) for i, b in enumerate(good) if b])
        async with await Link.in_memory(rx, CFG) as fresh, fresh.session(good_m) as s:
            await send_all(s, good, [(i, 0, len(b)) for i, b in enumerate(good) if b])
        assert [bytes(b) for b in (await (await rx.next_session()).complete()).buffers] == good


async def test_corrupted_chunk_is_refused_before_install() -> None:
    await _one_tampered_chunk(_flip_last_byte, {AbortCode.CHECKSUM})


async def test_replayed_chunk_is_refused_before_install() -> None:
    # The copy claims bytes already received (PROTOCOL) and fails its MAC (wrong sequence number).
    await _one_tampered_chunk(lambda data: data + data, {AbortCode.PROTOCOL})


async def test_corrupted_chunk_header_is_caught_by_its_mac() -> None:
    def move(data: bytes) -> bytes:  # shift the chunk's offset field: right bytes, wrong place
        if _is_chunk(data):
            raw = bytearray(data)
            raw[8 + 12] ^= 0x01
            return bytes(raw)
        return data

    rng = random.Random(11)
    m = random_manifest(rng)
    while max(m.layer_bytes()) < 10:
        m = random_manifest(rng)
    payload = random_payload(rng, m)
    async with Receiver(CFG, Allocator()) as rx, await Link.in_memory(rx, CFG) as link:
        s = await link.open(m)
        ins = await rx.next_session()
        _tamper(link, move)
        big = max(range(m.num_layers), key=lambda i: len(payload[i]))
        with pytest.raises(SessionAborted):
            await s.send(big, 0, memoryview(payload[big])[:8])
            await s.send(big, 8, memoryview(payload[big])[8:])
            await asyncio.sleep(0.05)
            await s.finish()
        with pytest.raises(SessionAborted) as got:
            await ins.complete()
        assert got.value.code in (AbortCode.CHECKSUM, AbortCode.PROTOCOL)


async def test_unknown_frame_closes_that_sender_only() -> None:
    rng = random.Random(5)
    async with Receiver(CFG, Allocator()) as rx:
        bad_link = await Link.in_memory(rx, CFG)
        good_link = await Link.in_memory(rx, CFG)
        m = random_manifest(rng)
        s_bad = await bad_link.open(m)
        in_bad = await rx.next_session()
        bad_link._channels[0].write_nowait(struct.pack("<2sBBI", b"PK", F.VERSION, 99, 0))
        with pytest.raises(SessionAborted) as got:
            await in_bad.complete()
        assert got.value.code is AbortCode.CONNECTION_LOST
        with pytest.raises((SessionAborted, ConnectError)):
            await s_bad.finish()
        # Another sender is served as if nothing happened.
        m2 = random_manifest(rng, "other")
        p2 = random_payload(rng, m2)
        async with good_link, good_link.session(m2) as s:
            await send_all(s, p2, [(i, 0, len(b)) for i, b in enumerate(p2) if b])
        assert [bytes(b) for b in (await (await rx.next_session()).complete()).buffers] == p2
        await bad_link.aclose()


async def test_truncated_stream_hands_nothing_over() -> None:
    rng = random.Random(8)
    m = random_manifest(rng)
    while m.num_bytes < 1000:
        m = random_manifest(rng)
    payload = random_payload(rng, m)
    async with Receiver(CFG, Allocator()) as rx, await Link.in_memory(rx, CFG) as link:
        s = await link.open(m)
        ins = await rx.next_session()
        _tamper(link, lambda d: d[: len(d) // 2] if len(d) > 100 else d)
        big = max(range(m.num_layers), key=lambda i: len(payload[i]))
        await s.send(big, 0, payload[big])
        await asyncio.sleep(0.05)
        link._channels[0].close()
        with pytest.raises(SessionAborted) as got:
            await ins.complete()
        assert got.value.code is AbortCode.CONNECTION_LOST
        assert ins.assembly.buffers == ()


async def test_stalled_sender_is_aborted_with_a_reason() -> None:
    cfg = dataclasses.replace(CFG, stall_timeout_s=0.3)
    rng = random.Random(9)
    m = random_manifest(rng)
    while m.num_bytes < 10:
        m = random_manifest(rng)
    async with Receiver(cfg, Allocator()) as rx, await Link.in_memory(rx, cfg) as link:
        s = await link.open(m)
        ins = await rx.next_session()
        with pytest.raises(SessionAborted) as got:
            await ins.complete()
        assert got.value.code is AbortCode.TIMEOUT and "stalled" in got.value.reason
        await asyncio.sleep(0.01)
        assert s.state is SessionState.ABORTED and s.error is not None and s.error.by_peer


async def test_stalled_receiver_bounds_in_flight_bytes() -> None:
    cfg = dataclasses.replace(
        CFG, max_inflight_bytes_per_session=16384, max_inflight_bytes_per_link=16384, timeout_s=0.3
    )
    m = random_manifest(random.Random(4))
    while m.num_bytes < 100_000:
        m = random_manifest(random.Random(m.num_bytes + 1))
    payload = random_payload(random.Random(0), m)
    async with Receiver(cfg, Allocator()) as rx, await Link.in_memory(rx, cfg) as link:
        s = await link.open(m)
        _tamper(link, lambda d: b"")  # the receiver never sees a byte, so never acks
        with pytest.raises(TimeoutError, match="send window"):
            await send_all(s, payload, [(i, 0, len(b)) for i, b in enumerate(payload) if b])
        assert link._inflight <= cfg.max_inflight_bytes_per_link
        await s.abort("test over")


async def test_cancel_from_either_side() -> None:
    rng = random.Random(12)
    m = random_manifest(rng)
    while m.num_bytes < 10:
        m = random_manifest(rng)
    payload = random_payload(rng, m)
    async with Receiver(CFG, Allocator()) as rx, await Link.in_memory(rx, CFG) as link:
        # Receiver cancels: the producer's next call raises.
        s = await link.open(m)
        ins = await rx.next_session()
        ins.abort("decode node draining")
        await asyncio.sleep(0.01)
        with pytest.raises(SessionAborted, match="draining") as info:
            await send_all(s, payload, [(i, 0, len(b)) for i, b in enumerate(payload) if b])
        assert info.value.by_peer and info.value.code is AbortCode.CANCELLED
        # Sender's producer fails inside the block: the receiver learns why.
        with pytest.raises(RuntimeError):
            async with link.session(m):
                ins2 = await rx.next_session()
                raise RuntimeError("prefill crashed")
        with pytest.raises(SessionAborted, match="prefill crashed") as info:
            await ins2.complete()
        assert info.value.by_peer


async def test_producer_mistakes_are_value_errors() -> None:
    m = random_manifest(random.Random(13))
    while m.num_bytes < 10 or m.layer_bytes()[0] < 2:
        m = random_manifest(random.Random(m.num_bytes + 7))
    async with (
        Receiver(CFG, Allocator()) as rx,
        await Link.in_memory(rx, CFG) as link,
        link.session(m) as s,
    ):
        await s.send(0, 0, b"\0")
        with pytest.raises(ValueError, match="overlap"):
            await s.send(0, 0, b"\0")
        with pytest.raises(ValueError, match="outside"):
            await s.send(0, m.layer_bytes()[0], b"\0")
        with pytest.raises(ValueError, match="not all sent"):
            await s.finish()


async def test_receiver_keeps_no_reference_to_finished_sessions_buffers() -> None:
    import gc
    import weakref

    import numpy as np

    refs: list[weakref.ref[np.ndarray]] = []

    def allocate(m):  # type: ignore[no-untyped-def]
        bufs = [np.zeros(n, np.uint8) for n in m.layer_bytes()]
        refs.extend(weakref.ref(b) for b in bufs)
        return bufs

    rng = random.Random(21)
    async with Receiver(CFG, allocate) as rx, await Link.in_memory(rx, CFG) as link:
        for k in range(3):
            m = random_manifest(rng, f"r{k}")
            payload = random_payload(rng, m)
            async with link.session(m) as s:
                ins = await rx.next_session()
                if k == 1:
                    ins.abort("dropped by the consumer")
                    continue
                await send_all(s, payload, [(i, 0, len(b)) for i, b in enumerate(payload) if b])
            await ins.complete()
        del ins
        gc.collect()
        assert refs and all(r() is None for r in refs)
