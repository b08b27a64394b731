"""``Channel``: one connection as the engine sees it, over TCP, TLS or memory.

A channel owns a sans-I/O ``codec.Connection`` and moves bytes between it and a byte stream:
incoming bytes are written straight into ``codec.get_buffer()`` (for a CHUNK that is the consumer's
own buffer), then parsed events are handed to the engine's ``ChannelHandler``. Three kinds:

- ``ProtocolChannel``: an ``asyncio.BufferedProtocol`` (the receiver always; the sender under TLS).
  MEASURED.md: the buffered-protocol receive path reached 4.6 GB/s, asyncio streams 0.4-1.2.
- ``SocketChannel``: the plain-TCP sender: ``loop.sock_sendall`` straight from the producer's
  memory (no copy into a transport buffer) and a small reader task for the receiver's replies.
- ``MemoryChannel``: an in-memory pair that delivers bytes split at random boundaries, so unit
  tests run the same engine with no sockets.

Frames after the handshake are tagged with their position in the connection's stream, so they
must reach the wire in the order they were tagged: ``write_frames`` tags them only once nothing
can overtake them (for ``SocketChannel``: under its write lock), and a write that waited and was
cancelled before it started has tagged nothing.

Owns no policy: which frames to send and what events mean is the engine's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from prfaas.transfer import frames as F
from prfaas.transfer.codec import Connection, ConnState
from prfaas.transfer.errors import LocalProtocolError, ProtocolError

Buffer = bytes | bytearray | memoryview
OutFrame = tuple[F.Frame, Buffer | None]
"""A frame to write and, for a CHUNK, its payload."""
_MAX_LOWAT_BYTES = 4 << 20
_JUNK = bytearray(65536)
"""Where bytes go that arrive after a channel closed: shared, never read (one per channel cost
64 KiB for each unauthenticated connection)."""


class ChannelHandler(Protocol):
    def on_events(self, channel: Channel) -> None:
        """New events are waiting in ``channel.codec``."""

    def on_closed(self, channel: Channel, exc: BaseException | None) -> None:
        """The channel is gone (``exc`` says why; a ProtocolError if the peer misbehaved)."""


class Channel:
    """Common receive logic; subclasses provide the byte stream."""

    def __init__(self, codec: Connection, handler: ChannelHandler) -> None:
        self.codec = codec
        self.handler = handler
        self.closed = False
        self.close_reason: BaseException | None = None
        self.tag: object = None
        """The engine's per-channel data (e.g. which peer it belongs to)."""
        self.write_timeout_s = 30.0
        """``write`` raises TimeoutError after this long without room to write."""

    # -- subclass interface -------------------------------------------------------------------
    async def write(self, *parts: Buffer) -> None:
        """Write ``parts`` back to back (never interleaved with another write); returns when the
        bytes are with the kernel or bounded buffering. Raises ConnectionError if closed, and
        TimeoutError after ``write_timeout_s`` without room (the caller closes the channel)."""
        raise NotImplementedError

    def write_nowait(self, data: bytes) -> None:
        """Queue a small control frame (acks, aborts), already tagged: the caller tags and queues
        in one step, so the order holds (this returns before anything else can write)."""
        raise NotImplementedError

    async def write_frames(self, frames: Sequence[OutFrame]) -> None:
        """Tag ``frames`` and write them (each CHUNK followed by its payload) as ``write`` does.
        Here tagging and the start of the write are one synchronous step, so nothing overtakes."""
        parts: list[Buffer] = []
        for frame, payload in frames:
            parts.append(self.codec.send(frame, payload))
            if payload is not None:
                parts.append(payload)
        await self.write(*parts)

    def peer_address(self) -> str:
        """``host:port`` of the other end, for logs."""
        sock = self.socket()
        if sock is None:
            return "?"
        try:
            host, port, *_ = sock.getpeername()
        except (OSError, ValueError):
            return "?"
        return f"{host}:{port}"

    def _shutdown(self) -> None:
        raise NotImplementedError

    def socket(self) -> socket.socket | None:
        return None

    # -- shared -------------------------------------------------------------------------------
    def close(self, exc: BaseException | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = exc
        self._shutdown()
        self.handler.on_closed(self, exc)

    def _fed(self, num_bytes: int) -> bool:
        """``num_bytes`` landed in the codec's buffer. False once the channel is closed."""
        try:
            self.codec.buffer_updated(num_bytes)
        except ProtocolError as exc:
            self._flush()
            self.handler.on_events(self)  # frames parsed before the error still count
            if not self.closed:
                self._fail(exc)
            return False
        self._flush()
        self.handler.on_events(self)
        return not self.closed

    def _flush(self) -> None:
        out = self.codec.data_to_send()
        if out and not self.closed:
            self.write_nowait(out)

    def _fail(self, exc: ProtocolError) -> None:
        # Best effort: tell the peer why before closing (the auth failure already queued one).
        with contextlib.suppress(Exception):
            self.write_nowait(self.codec.send(F.Abort(0, exc.code, str(exc)[:500])))
        self.close(exc)


class ProtocolChannel(Channel, asyncio.BufferedProtocol):
    """A channel on an asyncio transport (plain TCP or TLS)."""

    def __init__(
        self,
        codec: Connection,
        handler: ChannelHandler,
        *,
        handshake_timeout_s: float,
        refuse: str | None = None,
    ) -> None:
        super().__init__(codec, handler)
        self.transport: asyncio.Transport | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._handshake_timeout_s = handshake_timeout_s
        self._refuse = refuse  # close as soon as connected, with this reason
        self._peer_address = "?"
        # Armed now, not in connection_made: under TLS that comes only after asyncio's own
        # handshake, and a peer that never finishes it would otherwise never be timed out here.
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(handshake_timeout_s, self._check_handshake)
        self._lowat_sock: Any = None
        self._lowat = 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.closed:  # timed out during the TLS handshake
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self._peer_address = f"{peer[0]}:{peer[1]}"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if transport.get_extra_info("sslcontext") is None:  # TLS records: not our byte counts
                self._lowat_sock = sock
        if self._refuse is not None:
            self.close(ConnectionRefusedError(self._refuse))

    def _check_handshake(self) -> None:
        # Absolute, not reset by progress: a peer trickling a byte at a time is cut all the same.
        if self.codec.state is not ConnState.READY and not self.closed:
            why = f"no authenticated handshake within {self._handshake_timeout_s:g} s"
            self.close(TimeoutError(why))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.closed:
            return memoryview(_JUNK)
        try:
            return self.codec.get_buffer()
        except ProtocolError:
            return memoryview(_JUNK)

    def buffer_updated(self, nbytes: int) -> None:
        if not self.closed and self._fed(nbytes) and self._lowat_sock is not None:
            self._wait_for_payload()

    def _wait_for_payload(self) -> None:
        """Inside a chunk's payload, have the kernel wake us only once the rest of it (at most
        ``_MAX_LOWAT_BYTES``) is queued (SO_RCVLOWAT); back to every byte between payloads.
        Each wakeup costs the *sender* a cross-CPU wakeup on its way through the loopback or
        the NIC's softirq: in this VM one wakeup per 1 MiB instead of one per segment train moved
        a bare Python sender from 5.2 to 8.9 GB/s (docs/transfer.md). The kernel still wakes us
        if its receive buffer fills first, so this cannot deadlock."""
        want = min(self.codec.payload_bytes_expected(), _MAX_LOWAT_BYTES) or 1
        if want != self._lowat:
            try:
                self._lowat_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            except OSError:
                self._lowat_sock = None  # not supported here: wake on every byte as before
                return
            self._lowat = want

    def eof_received(self) -> bool:
        self.close(ConnectionResetError("the peer closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._can_write.set()
        self.close(exc or ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    async def write(self, *parts: Buffer) -> None:
        if self.closed or self.transport is None:
            raise ConnectionResetError("channel closed")
        for part in parts:  # no await in between: frames never interleave
            self.transport.write(part)
        if not self._can_write.is_set():
            async with asyncio.timeout(self.write_timeout_s):
                await self._can_write.wait()
            if self.closed:
                raise ConnectionResetError("channel closed")

    def write_nowait(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def socket(self) -> socket.socket | None:
        return None if self.transport is None else self.transport.get_extra_info("socket")

    def peer_address(self) -> str:
        return self._peer_address  # kept from connection_made: still known after the close

    def _shutdown(self) -> None:
        self._timer.cancel()
        if self.transport is not None:
            self.transport.close()


class SocketChannel(Channel):
    """Plain-TCP sender side: ``sock_sendall`` from the producer's memory, a reader task."""

    def __init__(self, sock: socket.socket, codec: Connection, handler: ChannelHandler) -> None:
        super().__init__(codec, handler)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader = self._loop.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        try:
            while not self.closed:
                n = await self._loop.sock_recv_into(self.sock, self.codec.get_buffer())
                if n == 0:
                    self.close(ConnectionResetError("the peer closed the connection"))
                    return
                if not self._fed(n):
                    return
        except (OSError, ProtocolError) as exc:
            self.close(exc)

    async def write(self, *parts: Buffer) -> None:
        async with self._lock:
            await self._write_locked(parts)

    async def write_frames(self, frames: Sequence[OutFrame]) -> None:
        async with self._lock:  # tag only now: a frame waiting for the lock has no number yet
            if self.closed:
                raise ConnectionResetError("channel closed")
            parts: list[Buffer] = []
            try:
                for frame, payload in frames:
                    parts.append(self.codec.send(frame, payload))
                    if payload is not None:
                        parts.append(payload)
            except LocalProtocolError as exc:  # it failed or closed while this write waited
                raise ConnectionResetError(f"connection no longer usable: {exc}") from exc
            await self._write_locked(parts)

    async def _write_locked(self, parts: Sequence[Buffer]) -> None:
        if self.closed:
            raise ConnectionResetError("channel closed")
        try:
            await self._sendmsg_all([memoryview(p).cast("B") for p in parts if len(p)])
        except OSError as exc:
            self.close(exc)
            raise
        except asyncio.CancelledError:
            # A write cut short leaves half a frame on the wire: the stream is unusable.
            self.close(ConnectionResetError("write cancelled mid-frame"))
            raise

    async def _sendmsg_all(self, views: list[memoryview]) -> None:
        """Gather-write header and payload in one syscall (one TCP segment train, not a 40-byte
        segment per chunk), straight from the producer's memory."""
        while views:
            try:
                sent = self.sock.sendmsg(views)
            except (BlockingIOError, InterruptedError):
                sent = 0
            while sent and views:
                if sent >= len(views[0]):
                    sent -= len(views[0])
                    views.pop(0)
                else:
                    views[0] = views[0][sent:]
                    sent = 0
            if views:
                await self._writable()

    async def _writable(self) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        fd = self.sock.fileno()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        self._loop.add_writer(fd, ready)
        try:
            async with asyncio.timeout(self.write_timeout_s):  # armed only when the socket is full
                await fut
        finally:
            if not self.closed:
                self._loop.remove_writer(fd)

    def write_nowait(self, data: bytes) -> None:
        task = self._loop.create_task(self._write_quiet(data))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write_quiet(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            await self.write(data)

    def socket(self) -> socket.socket | None:
        return self.sock

    def _shutdown(self) -> None:
        current = asyncio.current_task()
        if self._reader is not current:
            self._reader.cancel()
        with contextlib.suppress(Exception):
            self._loop.remove_writer(self.sock.fileno())
            self._loop.remove_reader(self.sock.fileno())
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class MemoryChannel(Channel):
    """One end of an in-memory pair. Bytes reach the peer on the next loop iterations, cut into
    pieces of random size (1..``max_piece_bytes``) so every split path of the codec is exercised."""

    def __init__(
        self, codec: Connection, handler: ChannelHandler, rng: random.Random, max_piece_bytes: int
    ) -> None:
        super().__init__(codec, handler)
        self.peer: MemoryChannel | None = None
        self._rng = rng
        self._max_piece = max_piece_bytes
        self._loop = asyncio.get_running_loop()
        self.tamper: list[object] = []
        """Test hook: callables ``f(bytes) -> bytes`` applied to every outgoing write."""

    async def write(self, *parts: Buffer) -> None:
        if self.closed:
            raise ConnectionResetError("channel closed")
        self.write_nowait(b"".join(bytes(p) for p in parts))
        await asyncio.sleep(0)

    def write_nowait(self, data: bytes) -> None:
        for f in self.tamper:
            data = f(data)  # type: ignore[operator]
        if self.peer is not None and not self.closed:
            self._loop.call_soon(self.peer._deliver, data)

    def _deliver(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.closed:
            buf = self.codec.get_buffer()
            n = min(len(buf), len(view), self._rng.randint(1, self._max_piece))
            buf[:n] = view[:n]
            view = view[n:]
            if not self._fed(n):
                return

    def peer_address(self) -> str:
        return "memory"

    def _shutdown(self) -> None:
        peer, self.peer = self.peer, None
        if peer is not None and not peer.closed:
            self._loop.call_soon(peer.close, ConnectionResetError("the peer closed the connection"))


def memory_pair(
    a: tuple[Connection, ChannelHandler],
    b: tuple[Connection, ChannelHandler],
    rng: random.Random,
    max_piece_bytes: int = 1 << 16,
) -> tuple[MemoryChannel, MemoryChannel]:
    ca = MemoryChannel(a[0], a[1], rng, max_piece_bytes)
    cb = MemoryChannel(b[0], b[1], rng, max_piece_bytes)
    ca.peer, cb.peer = cb, ca
    return ca, cb


def all_sockets(channels: Iterable[Channel]) -> list[socket.socket]:
    return [s for s in (c.socket() for c in channels) if s is not None]
