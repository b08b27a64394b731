"""The engine over loopback TCP (and TLS): byte-exact delivery, refusal of wrong keys, monitor."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prfaas.core import LinkId
from prfaas.spec import DType, LayerKind
from prfaas.transfer import (
    ConnectError,
    LayerEntry,
    Link,
    LinkMonitor,
    Manifest,
    Receiver,
    SessionAborted,
    TensorEntry,
    TransferConfig,
)
from prfaas.transfer import frames as F
from prfaas.transfer.codec import Connection, Role
from transfer_helpers import (
    KEY,
    Allocator,
    random_manifest,
    random_payload,
    random_ranges,
    send_all,
    tls_contexts,
)

pytestmark = pytest.mark.timeout(60)
CFG = TransferConfig(psk=KEY, num_connections=3, chunk_bytes=8192, timeout_s=5)


async def _roundtrip(seed: int, cfg: TransferConfig, rx_cfg: TransferConfig | None = None) -> None:
    rng = random.Random(seed)
    async with Receiver(rx_cfg or cfg, Allocator()) as rx:
        host, port = await rx.listen()
        async with await Link.connect(host, port, cfg) as link:
            for k in range(2):
                m = random_manifest(rng, f"r{k}")
                payload = random_payload(rng, m)
                async with link.session(m) as s:
                    ins = await rx.next_session()
                    await send_all(s, payload, random_ranges(rng, payload), first=k)
                d = await ins.complete()
                assert [bytes(b) for b in d.buffers] == payload and d.first_token == k


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), conns=st.integers(1, 4))
def test_random_manifests_over_loopback(seed: int, conns: int) -> None:
    asyncio.run(_roundtrip(seed, dataclasses.replace(CFG, num_connections=conns)))


async def test_tls_roundtrip(tmp_path: Path) -> None:
    ctx = tls_contexts(tmp_path)
    if ctx is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    server, client = ctx
    rx_cfg = dataclasses.replace(CFG, ssl_context=server)
    tx_cfg = dataclasses.replace(CFG, ssl_context=client, server_hostname="localhost")
    await _roundtrip(1, tx_cfg, rx_cfg)


async def _raw_client(port: int) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    return sock


async def _read_until_closed(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    got = b""
    async with asyncio.timeout(5):
        while chunk := await loop.sock_recv(sock, 65536):
            got += chunk
    return got


async def test_wrong_key_peer_is_refused_before_any_kv_byte() -> None:
    """A client that ignores the acceptor's proof, sends a wrong AUTH and then a CHUNK: refused at
    AUTH, connection closed, nothing allocated, nothing written."""
    alloc = Allocator()
    async with Receiver(CFG, alloc) as rx:
        _, port = await rx.listen()
        sock = await _raw_client(port)
        rogue = Connection(Role.INITIATOR, b"wrong-key-wrong-key!", nonce=os.urandom(16))
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, rogue.initiate())
        await asyncio.sleep(0.05)
        manifest = random_manifest(random.Random(0))
        junk = (
            F.encode_frame(F.Auth(b"\0" * 32))
            + F.encode_frame(F.Open(1, manifest))
            + F.encode_frame(F.Chunk(1, 0, 0, 200, b"\0" * F.TAG_BYTES))
            + b"KV" * 100
        )
        with contextlib.suppress(OSError):  # the receiver may already have closed: fine
            await loop.sock_sendall(sock, junk)
        reply = await _read_until_closed(sock)
        sock.close()
        assert F.encode_frame(F.Abort(0, F.AbortCode.AUTH, "authentication failed")) in reply
        assert alloc.calls == [] and rx.bytes_verified == 0
        assert rx.num_handshake_failures == 1


async def test_silent_or_garbage_clients_are_dropped() -> None:
    alloc = Allocator()
    async with Receiver(dataclasses.replace(CFG, handshake_timeout_s=0.3), alloc) as rx:
        _, port = await rx.listen()
        silent = await _raw_client(port)
        garbage = await _raw_client(port)
        await asyncio.get_running_loop().sock_sendall(garbage, b"GET / HTTP/1.1\r\n\r\n")
        await _read_until_closed(garbage)
        await _read_until_closed(silent)  # closed by the handshake timeout
        silent.close()
        garbage.close()
        assert alloc.calls == [] and rx.num_handshake_failures == 2


async def test_sender_with_wrong_key_gets_connect_error() -> None:
    alloc = Allocator()
    async with Receiver(CFG, alloc) as rx:
        host, port = await rx.listen()
        with pytest.raises(ConnectError):
            await Link.connect(host, port, dataclasses.replace(CFG, psk=b"x" * 16))
        assert alloc.calls == []


async def test_connect_to_nothing_is_a_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectError, match="cannot connect"):
        await Link.connect("127.0.0.1", port, CFG)


async def test_monitor_publishes_link_state() -> None:
    rng = random.Random(3)
    async with Receiver(CFG, Allocator()) as rx:
        host, port = await rx.listen()
        async with await Link.connect(host, port, CFG) as link:
            mon = LinkMonitor(link, LinkId("a->b"))
            loop = asyncio.get_running_loop()
            assert mon.sample(loop.time()) is None
            m = random_manifest(rng)
            payload = random_payload(rng, m)
            async with link.session(m) as s:
                await send_all(s, payload, random_ranges(rng, payload))
            await asyncio.sleep(0.01)
            state = mon.sample(loop.time())
            assert state is not None and state.link_id == "a->b"
            assert state.goodput_bytes_per_s > 0 and state.rtt_s > 0
            assert state.backlog_bytes == 0 and state.retransmit_rate == 0.0
            published: list[object] = []
            task = asyncio.create_task(mon.run(published.append, interval_s=0.01))
            async with asyncio.timeout(10):
                while len(published) < 2:
                    await asyncio.sleep(0.01)
            task.cancel()
            assert all(getattr(p, "link_id", None) == "a->b" for p in published)


class _StallingReceiver(asyncio.Protocol):
    """Authenticates, accepts every session, then stops reading: a stalled decode node."""

    def __init__(self) -> None:
        self.codec = Connection(Role.ACCEPTOR, KEY, nonce=os.urandom(16))
        self.codec.chunk_sink = lambda chunk: None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.codec.receive_data(data)
        self.transport.write(self.codec.data_to_send())
        while (ev := self.codec.next_event()) is not None:
            if isinstance(ev, F.Open):
                self.transport.write(self.codec.send(F.Accept(ev.session_id)))
                self.transport.pause_reading()


async def test_stalled_receiver_times_out_the_sender() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_StallingReceiver, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cfg = dataclasses.replace(CFG, num_connections=2, timeout_s=1.0, chunk_bytes=1 << 20)
    big = bytes(64 << 20)
    tensor = TensorEntry("state", DType.FP32, (len(big) // 4,))
    m = Manifest("big", 1, 0, (LayerEntry(0, LayerKind.LINEAR, 0, 0, (tensor,)),))
    try:
        async with await Link.connect("127.0.0.1", port, cfg) as link:
            s = await link.open(m)
            with pytest.raises((TimeoutError, SessionAborted)):
                await s.send(0, 0, big)
                await s.finish()
    finally:
        server.close()


async def test_many_concurrent_sessions_share_the_connections() -> None:
    rng = random.Random(77)
    jobs = []
    for k in range(40):
        m = random_manifest(rng, f"many-{k}")
        payload = random_payload(rng, m)
        jobs.append((m, payload, random_ranges(rng, payload)))
    cfg = dataclasses.replace(CFG, num_connections=4, chunk_bytes=4096)
    async with Receiver(cfg, Allocator()) as rx:
        host, port = await rx.listen()
        async with await Link.connect(host, port, cfg) as link:

            async def one(
                m: Manifest, payload: list[bytes], pieces: list[tuple[int, int, int]]
            ) -> None:
                async with link.session(m) as s:
                    await send_all(s, payload, pieces)

            async with asyncio.TaskGroup() as tg:
                for job in jobs:
                    tg.create_task(one(*job))
            got = {}
            for _ in jobs:
                d = await (await rx.next_session()).complete()
                got[d.request_id] = [bytes(b) for b in d.buffers]
            assert all(got[m.request_id] == payload for m, payload, _ in jobs)
            assert link.counters().backlog_bytes == 0


async def test_a_session_with_nothing_to_send_still_completes() -> None:
    from prfaas.spec import CacheSpec, LayerCache

    spec = CacheSpec((LayerCache.gqa(2, 8), LayerCache.mla(16, 4)))
    m = Manifest.from_layout("all-cached", spec.layout(50, 50))
    assert m.num_bytes == 0
    async with Receiver(CFG, Allocator()) as rx:
        host, port = await rx.listen()
        async with await Link.connect(host, port, CFG) as link:
            async with link.session(m) as s:
                await s.finish(first_token=3)
            assert (await (await rx.next_session()).complete()).first_token == 3


async def test_finish_waits_while_the_queued_bytes_are_still_crossing() -> None:
    """``timeout_s`` bounds a wait without progress: a slow link still draining the session's
    window after END is progress, not a stall (a 64 MB window on a link under ~17 Mbit/s takes
    over the default 30 s to drain; the session must still complete)."""
    data = random.Random(11).randbytes(2 << 20)
    tensor = TensorEntry("state", DType.FP32, (len(data) // 4,))
    m = Manifest("slow", 1, 0, (LayerEntry(0, LayerKind.LINEAR, 0, 0, (tensor,)),))
    # All of it fits the window, so send returns at once and finish() waits ~1.5 s for the
    # paced writer: three times timeout_s.
    cfg = dataclasses.replace(CFG, timeout_s=0.5, rate_limit_bytes_per_s=len(data) / 1.5)
    async with Receiver(CFG, Allocator()) as rx:
        host, port = await rx.listen()
        async with await Link.connect(host, port, cfg) as link:
            async with link.session(m) as s:
                ins = await rx.next_session()
                await send_all(s, [data], [(0, 0, len(data))])
                assert s.bytes_sent == len(data)
            d = await ins.complete()
    assert bytes(d.buffers[0]) == data


async def test_finish_still_times_out_when_nothing_moves() -> None:
    """Every byte written and no COMPLETE (the receiver stopped reading): ``finish`` gives up
    after ``timeout_s``, as before."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_StallingReceiver, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cfg = dataclasses.replace(CFG, num_connections=1, timeout_s=0.5)
    small = bytes(16 << 10)  # fits the socket buffers: all of it is written at once
    tensor = TensorEntry("state", DType.FP32, (len(small) // 4,))
    m = Manifest("small", 1, 0, (LayerEntry(0, LayerKind.LINEAR, 0, 0, (tensor,)),))
    try:
        async with await Link.connect("127.0.0.1", port, cfg) as link:
            s = await link.open(m)
            await s.send(0, 0, small)
            with pytest.raises(TimeoutError, match="COMPLETE"):
                await s.finish()
            assert s.bytes_sent == len(small)
    finally:
        server.close()
