"""The KV path against hostile peers over loopback TCP, TLS off: an active man in the middle that
rewrites bytes and recomputes every value it can, and floods of unauthenticated connections."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import socket
import struct
from pathlib import Path
from types import TracebackType

import pytest
import xxhash

from prfaas.transfer import (
    AbortCode,
    ConnectError,
    Link,
    Receiver,
    SessionAborted,
    TransferConfig,
)
from prfaas.transfer import frames as F
from prfaas.transfer.codec import PRE_AUTH_BUFFER_BYTES
from prfaas.transfer.mac import FrameMac, derive_keys
from transfer_helpers import (
    KEY,
    Allocator,
    random_manifest,
    random_payload,
    send_all,
    tls_contexts,
)

pytestmark = pytest.mark.timeout(120)
CFG = TransferConfig(psk=KEY, num_connections=2, chunk_bytes=8192, timeout_s=5)
MODES = ["pass-through", "xxh3-checksum", "gmac-guessed-key", "end-first-token"]


class Mitm:
    """A TCP relay between a sender and a receiver that, in ``mode``, rewrites traffic as an
    attacker on the link can: it reads the handshake in the clear (both nonces, the peer id),
    counts frames, and after the handshake rewrites one payload byte of the first CHUNK (or the
    first token of END) and recomputes the integrity fields: the unkeyed xxh3 checksum of wire
    version 1, the session digest, and a GMAC under keys derived from what it saw and a guessed
    pre-shared key (right if the keys did not depend on the real one)."""

    GUESS = b"attacker-guess-0123456789"

    def __init__(self, upstream_port: int, mode: str) -> None:
        self.upstream_port = upstream_port
        self.mode = mode
        self.num_tampered = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def __aenter__(self) -> Mitm:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for t in self._tasks:
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t

    async def _relay(self, r_in: asyncio.StreamReader, w_in: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        r_up, w_up = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        seen: dict[str, bytes] = {}
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._pump(r_in, w_up, seen, to_acceptor=True))
                tg.create_task(self._pump(r_up, w_in, seen, to_acceptor=False))
        except* (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (w_in, w_up):
                w.close()
            self._tasks.discard(task)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        seen: dict[str, bytes],
        to_acceptor: bool,
    ) -> None:
        num_after_auth = -1  # sender's frames after its AUTH: their sequence numbers
        while True:
            head = await reader.readexactly(F.HEADER_BYTES)
            _, _, ftype, body_len = F.HEADER.unpack(head)
            body = bytearray(await reader.readexactly(body_len))
            if not to_acceptor:
                if ftype == F.FrameType.CHALLENGE:
                    seen["nonce_a"] = bytes(body[: F.NONCE_BYTES])
            elif ftype == F.FrameType.HELLO:
                seen["peer_id"] = bytes(body[:16])
                seen["nonce_i"] = bytes(body[16:32])
            elif ftype == F.FrameType.AUTH:
                num_after_auth = 0
            else:
                if not self.num_tampered and self._tamper(head, body, ftype, num_after_auth, seen):
                    self.num_tampered += 1
                num_after_auth += 1
            writer.write(head + bytes(body))
            await writer.drain()

    def _tamper(
        self, head: bytes, body: bytearray, ftype: int, seq: int, seen: dict[str, bytes]
    ) -> bool:
        mac = FrameMac(
            derive_keys(
                self.GUESS, seen["nonce_i"], seen["nonce_a"], seen["peer_id"]
            ).initiator_to_acceptor
        )
        mac.next_seq = seq
        meta_end = F.CHUNK_META.size
        if ftype == F.FrameType.CHUNK and self.mode in ("xxh3-checksum", "gmac-guessed-key"):
            payload_at = F.CHUNK_META_BYTES
            body[payload_at + (len(body) - payload_at) // 2] ^= 0x01
            meta, payload = bytes(body[:meta_end]), bytes(body[payload_at:])
            if self.mode == "xxh3-checksum":  # wire version 1's checksum, where the tag now is
                tag = xxhash.xxh3_64(meta + payload).digest() + bytes(8)
            else:
                stream = mac.stream()
                for part in (head, meta, payload):
                    stream.update(part)
                tag = stream.tag()
            body[meta_end:payload_at] = tag
            return True
        if ftype == F.FrameType.END and self.mode == "end-first-token":
            # The digest covers only the chunking (layer, offset, length), which a rewritten first
            # token leaves as it was: the attacker keeps it and retags the frame.
            sid, num_chunks, digest, first = struct.unpack_from("<QIQq", body)
            new = struct.pack("<QIQq", sid, num_chunks, digest, first + 1)
            body[:] = new + mac.tag(head + new)
            return True
        return False


def _job(seed: int) -> tuple[object, list[bytes]]:
    rng = random.Random(seed)
    m = random_manifest(rng, "victim")
    while m.num_bytes < 20_000:
        m = random_manifest(rng, "victim")
    return m, random_payload(rng, m)


@pytest.mark.parametrize("mode", MODES)
async def test_man_in_the_middle_cannot_change_kv_without_the_key(mode: str) -> None:
    m, payload = _job(1)
    alloc = Allocator()
    pieces = [(i, 0, len(b)) for i, b in enumerate(payload) if b]
    async with Receiver(CFG, alloc) as rx:
        _, port = await rx.listen()
        async with Mitm(port, mode) as mitm:
            link = await Link.connect("127.0.0.1", mitm.port, CFG)
            async with link:
                s = await link.open(m)  # type: ignore[arg-type]
                ins = await rx.next_session()
                if mode == "pass-through":  # the relay itself is transparent
                    await send_all(s, payload, pieces, first=7)
                    d = await ins.complete()
                    assert [bytes(b) for b in d.buffers] == payload and d.first_token == 7
                    return
                with pytest.raises((SessionAborted, ConnectError)):
                    await send_all(s, payload, pieces, first=7)
                with pytest.raises(SessionAborted) as got:
                    await ins.complete()
            assert mitm.num_tampered == 1
    # Refused before install: never handed over, the consumer's buffers untouched from here on.
    assert ins._delivery is None and ins.assembly.buffers == ()
    assert "failed its MAC" in got.value.reason or "MAC mismatch" in got.value.reason
    if mode == "end-first-token":  # a control frame: the connection and its sessions
        assert got.value.code is AbortCode.CONNECTION_LOST and "END frame" in got.value.reason
    else:  # the session the bytes landed in is named
        assert got.value.code is AbortCode.CHECKSUM and "victim" in got.value.reason


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _raw_client(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def _read_until_closed(sock: socket.socket, timeout_s: float = 30) -> bytes:
    loop = asyncio.get_running_loop()
    got = b""
    async with asyncio.timeout(timeout_s):
        with contextlib.suppress(ConnectionResetError):
            while chunk := await loop.sock_recv(sock, 65536):
                got += chunk
    return got


async def _until(predicate: object, timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_300_idle_connections_declaring_huge_hellos_stay_bounded_and_are_cut() -> None:
    cfg = dataclasses.replace(CFG, handshake_timeout_s=1.0, max_pending_handshakes=1024)
    alloc = Allocator()
    loop = asyncio.get_running_loop()
    socks: list[socket.socket] = []
    try:
        async with Receiver(cfg, alloc) as rx:
            _, port = await rx.listen()
            rss0 = _rss_bytes()
            # 300 declare a 1 MiB HELLO: each is refused at its header, nothing is allocated.
            huge = [await _raw_client(port) for _ in range(300)]
            socks += huge
            for s in huge:
                await loop.sock_sendall(s, F.header(F.FrameType.HELLO, 1 << 20))
            await _until(lambda: rx.num_handshake_failures == 300)
            grew = _rss_bytes() - rss0
            replies = await asyncio.gather(*(_read_until_closed(s) for s in huge))
            assert all(r.startswith(F.header(F.FrameType.ABORT, 0)[:4]) for r in replies)
            assert all(b"HELLO body of 1048576 bytes" in r for r in replies)
            # 300 stay idle in the middle of a well-formed HELLO: held within the fixed bound ...
            idle = [await _raw_client(port) for _ in range(300)]
            socks += idle
            for s in idle:
                await loop.sock_sendall(s, F.header(F.FrameType.HELLO, 98) + bytes(40))
            await _until(lambda: rx.num_pending_handshakes == 300)
            assert rx.pre_auth_buffered_bytes() <= 300 * PRE_AUTH_BUFFER_BYTES
            grew = max(grew, _rss_bytes() - rss0)
            # ... and cut by the handshake timeout.
            await asyncio.gather(*(_read_until_closed(s) for s in idle))
            await _until(lambda: rx.num_pending_handshakes == 0)
            assert rx.num_handshake_failures == 600 and alloc.calls == []
            assert rx.pre_auth_buffered_bytes() == 0
            # Before the fix, 300 such HELLOs took a worker from 77 to 402 MB.
            assert grew < 48 << 20, f"RSS grew by {grew / 2**20:.1f} MiB"
    finally:
        for s in socks:
            s.close()


async def test_pending_handshakes_are_capped_and_refusals_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = dataclasses.replace(CFG, handshake_timeout_s=30, max_pending_handshakes=5)
    socks: list[socket.socket] = []
    caplog.set_level(logging.WARNING, logger="prfaas.transfer")
    try:
        async with Receiver(cfg, Allocator()) as rx:
            _, port = await rx.listen()
            for _ in range(5):
                socks.append(await _raw_client(port))
            await _until(lambda: rx.num_pending_handshakes == 5)
            oldest_port = socks[0].getsockname()[1]
            socks.append(await _raw_client(port))
            await _read_until_closed(socks[0])  # the oldest is cut for the newcomer, at once
            await _until(lambda: rx.num_handshake_failures == 1)
            assert rx.num_pending_handshakes == 5
            # A peer that is served gets in while the pending ones are still held.
            async with await Link.connect("127.0.0.1", port, CFG):
                pass
            assert rx.num_handshake_failures == 1 + CFG.num_connections  # the oldest made room
    finally:
        for s in socks:
            s.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "prfaas.transfer"]
    assert all(x.startswith("KV handshake from 127.0.0.1:") for x in lines), lines
    assert any(f":{oldest_port} " in x and "pending handshakes is full" in x for x in lines), lines


async def test_a_returning_peer_connects_while_an_attacker_holds_every_pending_handshake() -> None:
    """256 connections held open by an attacker (the default cap), some claiming the returning
    peer's name in their HELLO: a fresh link of a peer that authenticated before still connects,
    and so does a peer never seen (the oldest pending connection makes room)."""
    known = dataclasses.replace(CFG, name="pf0")
    cfg = dataclasses.replace(CFG, handshake_timeout_s=60)
    assert cfg.max_pending_handshakes == 256
    loop = asyncio.get_running_loop()
    socks: list[socket.socket] = []
    try:
        async with Receiver(cfg, Allocator()) as rx:
            _, port = await rx.listen()
            async with await Link.connect("127.0.0.1", port, known):
                pass  # pf0 authenticated once
            for i in range(300):
                s = await _raw_client(port)
                socks.append(s)
                if i % 10 == 0:  # some pose as pf0: their HELLO names it, they cannot prove it
                    hello = F.Hello(os.urandom(16), os.urandom(16), "pf0")
                    await loop.sock_sendall(s, F.encode_frame(hello))
            await _until(lambda: rx.num_pending_handshakes >= 256)
            assert rx.num_pending_handshakes <= 256 + 16
            for _ in range(3):  # a fresh link each time, two connections each
                async with await Link.connect("127.0.0.1", port, known) as link:
                    assert link is not None
            async with await Link.connect("127.0.0.1", port, dataclasses.replace(CFG, name="new")):
                pass
            assert rx.num_pending_handshakes <= 256 + 16
    finally:
        for s in socks:
            s.close()


async def test_tls_connections_that_never_finish_any_handshake_are_cut(tmp_path: Path) -> None:
    """Under TLS asyncio runs its own handshake before ours begins: a peer that sends nothing is
    still cut after ``handshake_timeout_s`` and counted, and the pending slot is freed."""
    ctx = tls_contexts(tmp_path)
    if ctx is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    server_ctx, client_ctx = ctx
    cfg = dataclasses.replace(CFG, ssl_context=server_ctx, handshake_timeout_s=0.5)
    socks: list[socket.socket] = []
    try:
        async with Receiver(cfg, Allocator()) as rx:
            _, port = await rx.listen()
            socks = [await _raw_client(port) for _ in range(5)]
            await _until(lambda: rx.num_pending_handshakes == 5)
            await asyncio.gather(*(_read_until_closed(s) for s in socks))
            await _until(lambda: rx.num_pending_handshakes == 0)
            assert rx.num_handshake_failures == 5
            tx = dataclasses.replace(CFG, ssl_context=client_ctx, server_hostname="localhost")
            async with await Link.connect("127.0.0.1", port, tx):  # a real peer still gets in
                pass
            assert rx.num_handshake_failures == 5
    finally:
        for s in socks:
            s.close()
