"""``Link``: N authenticated connections to one receiver, carrying many ``OutboundSession``s.

The producer calls ``await session.send(layer, offset, view)`` for any byte range as soon as it is
computed; ``send`` queues it (holding a reference, not a copy) and returns unless the session's or
the link's in-flight bytes (queued or unacknowledged) are over their bound. One writer task per
connection takes the next chunk from the link's queue, paces it through the token bucket, tags it
(its MAC, under that connection's key) and writes it, so chunks are striped over the connections
and a faster connection takes more.
``finish(first_token)`` sends END with the session digest and waits for the receiver's COMPLETE.
Every wait is bounded by ``TransferConfig.timeout_s`` without progress. asyncio; no policy.

``counters()`` also says how much of the time the link, not its producer, was the limit:
``backlogged_s`` is the seconds during which some chunk had been queued and not yet written (it
waited for a writer, for the pacer's tokens or for socket space); within it, ``pacer_limited_s``
the seconds in which the token bucket held chunks back and ``write_blocked_s`` those in which a
writer waited for socket space (the kernel's send buffer full). Backlogged time alone is not
link-limited time: a process whose event loop is busy elsewhere leaves its queue standing while
the link idles. An interval limited throughout by the pacer or the socket measures what the link
carries; one that was not says only what the producer offered (``core.link_estimate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from dataclasses import dataclass
from types import TracebackType

from prfaas.transfer import frames as F
from prfaas.transfer.channel import (
    Channel,
    MemoryChannel,
    ProtocolChannel,
    SocketChannel,
    all_sockets,
    memory_pair,
)
from prfaas.transfer.codec import Authenticated, Connection, ConnState, Role
from prfaas.transfer.config import TransferConfig
from prfaas.transfer.errors import AbortCode, ConnectError, LocalProtocolError, SessionAborted
from prfaas.transfer.manifest import Manifest
from prfaas.transfer.outbound import OpenSession, OutboundSession, _Item
from prfaas.transfer.pacing import Pacer, TokenBucket, link_burst_bytes
from prfaas.transfer.session_state import SessionState, advance
from prfaas.transfer.waiting import Signal, wait_until


@dataclass(frozen=True, slots=True)
class LinkCounters:
    """Cumulative byte counts of a link (the monitor differentiates them)."""

    bytes_queued: int
    bytes_sent: int
    bytes_acked: int
    bytes_dropped: int
    num_sessions_open: int
    backlogged_s: float = 0.0
    """Cumulative seconds with a chunk queued by ``send`` and not yet written (taken by no writer
    yet, or held by one waiting for tokens or socket space): the link was the limit then."""
    pacer_limited_s: float = 0.0
    """Cumulative seconds the token bucket held reserved chunks back (0 unpaced): the link sent
    at its pacing rate then. A late wake-up (a busy event loop) is not counted."""
    write_blocked_s: float = 0.0
    """Cumulative seconds some connection's writer waited inside a write (for socket space: the
    network drained the kernel's buffer slower than the link offered)."""

    @property
    def link_limited_s(self) -> float:
        """Seconds the pacer or the socket held the link back (the two rarely overlap: a paced
        link is paced below what its sockets take)."""
        return self.pacer_limited_s + self.write_blocked_s

    @property
    def backlog_bytes(self) -> int:
        """Accepted for sending, not yet acknowledged by the receiver, not given up."""
        return self.bytes_queued - self.bytes_acked - self.bytes_dropped


class Link:
    """N authenticated connections to one receiver, carrying many sessions at once."""

    def __init__(self, config: TransferConfig) -> None:
        self.config = config
        self.peer_id = os.urandom(F.PEER_ID_BYTES)
        self._channels: list[Channel] = []
        self._sessions: dict[int, OutboundSession] = {}
        self._next_session_id = 1
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._signal = Signal()
        self._inflight = 0
        self._counts = [0, 0, 0, 0]  # queued, sent, acked, dropped (aborted before acked)
        self._writers: list[asyncio.Task[None]] = []
        self._error: ConnectError | None = None
        self._closed = False
        self._loop = loop = asyncio.get_running_loop()
        rate = config.rate_limit_bytes_per_s
        self._bucket: Pacer | None = None if rate is None else pacer(rate, loop.time())
        # Busy-time accounting (see counters()): bytes of enqueued chunks not yet written or
        # skipped, when that last became non-zero, and the closed backlogged seconds before it.
        self._unwritten = 0
        self._backlog_from_s = 0.0
        self._backlogged_s = 0.0
        self._pacer_closed_s = 0.0  # throttled seconds of buckets replaced by set_rate
        self._writing = 0  # writers inside a write now, since _writing_from_s
        self._writing_from_s = 0.0
        self._write_blocked_s = 0.0

    # -- construction -------------------------------------------------------------------------
    def _codec(self) -> Connection:
        return Connection(
            Role.INITIATOR,
            self.config.psk,
            nonce=os.urandom(F.NONCE_BYTES),
            peer_id=self.peer_id,
            name=self.config.name,
        )

    @classmethod
    async def connect(cls, host: str, port: int, config: TransferConfig) -> Link:
        """Open ``config.num_connections`` connections and authenticate each."""
        link = cls(config)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(config.timeout_s):
                for _ in range(config.num_connections):
                    if config.ssl_context is None:
                        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                        sock.setblocking(False)
                        try:
                            await loop.sock_connect(sock, (host, port))
                        except BaseException:
                            sock.close()
                            raise
                        ch: Channel = SocketChannel(sock, link._codec(), link)
                    else:
                        codec = link._codec()
                        _, ch = await loop.create_connection(
                            lambda c=codec: ProtocolChannel(  # type: ignore[misc]
                                c, link, handshake_timeout_s=config.timeout_s
                            ),
                            host,
                            port,
                            ssl=config.ssl_context,
                            server_hostname=config.server_hostname or host,
                        )
                    ch.write_timeout_s = config.timeout_s
                    link._channels.append(ch)
                await link._handshake()
        except BaseException as exc:
            await link.aclose()
            if isinstance(exc, ConnectError):
                raise
            if isinstance(exc, (OSError, TimeoutError)):
                raise ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
            raise
        return link

    @classmethod
    async def in_memory(
        cls, receiver: object, config: TransferConfig, rng: random.Random | None = None
    ) -> Link:
        """A link to ``receiver`` (a ``Receiver``) over in-memory channels: same engine, no
        sockets; bytes arrive cut at random boundaries."""
        from prfaas.transfer.receiver import Receiver

        assert isinstance(receiver, Receiver)
        link = cls(config)
        rng = rng or random.Random(0)
        for _ in range(config.num_connections):
            mine, theirs = memory_pair((link._codec(), link), (receiver._codec(), receiver), rng)
            receiver._adopt(theirs)
            link._channels.append(mine)
        try:
            await link._handshake()
        except BaseException:
            await link.aclose()
            raise
        return link

    async def _handshake(self) -> None:
        for ch in self._channels:
            hello = ch.codec.initiate()
            if isinstance(ch, MemoryChannel):
                ch.write_nowait(hello)
            else:
                await ch.write(hello)
        await wait_until(
            self._signal,
            lambda: all(ch.tag == "ready" for ch in self._channels),
            lambda: self._error,
            self.config.timeout_s,
            "the handshake",
        )
        self._writers = [asyncio.create_task(self._writer(ch)) for ch in self._channels]

    # -- public API ---------------------------------------------------------------------------
    def session(self, manifest: Manifest) -> OpenSession:
        """``async with link.session(manifest) as s``: OPEN, wait for ACCEPT (SessionAborted with
        code REFUSED if the receiver refused), stream, ``finish``; aborted if the block raises."""
        return OpenSession(self, manifest)

    async def open(self, manifest: Manifest) -> OutboundSession:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ConnectError("link closed")
        sid = self._next_session_id
        self._next_session_id += 1
        s = OutboundSession(self, sid, manifest)
        self._sessions[sid] = s
        try:
            await self._write_control(s._channel, F.Open(sid, manifest))
            await wait_until(
                self._signal,
                lambda: s.state is not SessionState.OPENING,
                lambda: s.error or self._error,
                self.config.timeout_s,
                f"ACCEPT of request {manifest.request_id}",
            )
        except BaseException as exc:
            if not s.state.terminal:
                await asyncio.shield(s.abort(f"open failed: {exc!r}"))
            raise
        return s

    def counters(self) -> LinkCounters:
        q, s, a, d = self._counts
        now = self._loop.time()
        backlogged = self._backlogged_s
        if self._unwritten > 0:
            backlogged += now - self._backlog_from_s
        paced = self._pacer_closed_s
        if self._bucket is not None:
            paced += self._bucket.throttled_s(now)
        blocked = self._write_blocked_s
        if self._writing:
            blocked += now - self._writing_from_s
        return LinkCounters(q, s, a, d, len(self._sessions), backlogged, paced, blocked)

    def sockets(self) -> list[socket.socket]:
        """The connections' sockets (for ``TCP_INFO``; empty in memory)."""
        return all_sockets(self._channels)

    @property
    def rate_bytes_per_s(self) -> float | None:
        """The pacing rate in force (None: unpaced)."""
        return None if self._bucket is None else self._bucket.rate_bytes_per_s

    def share_pacer(self, bucket: Pacer | None) -> None:
        """Pace this link with ``bucket`` (None: unpaced) from the next chunk on: links given
        the same bucket share one rate, as connections to several receivers over one emulated
        inter-site link do (``transfer.link_pool`` hands them out). Its owner changes the
        shared bucket's rate."""
        if self._bucket is not None and self._bucket is not bucket:
            self._pacer_closed_s += self._bucket.throttled_s(self._loop.time())
        self._bucket = bucket

    def set_rate(self, rate_bytes_per_s: float | None) -> None:
        """Change the pacing rate (None: unpaced) for chunks not yet written."""
        now = asyncio.get_running_loop().time()
        if rate_bytes_per_s is None:
            if self._bucket is not None:
                self._pacer_closed_s += self._bucket.throttled_s(now)
            self._bucket = None
        elif isinstance(self._bucket, TokenBucket):
            self._bucket.set_rate(rate_bytes_per_s, link_burst_bytes(rate_bytes_per_s), now)
        else:  # none, or a shared one: this link gets its own
            if self._bucket is not None:
                self._pacer_closed_s += self._bucket.throttled_s(now)
            self._bucket = pacer(rate_bytes_per_s, now)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for s in list(self._sessions.values()):
            s._set_aborted(SessionAborted(AbortCode.SHUTDOWN, "link closed"))
        for w in self._writers:
            w.cancel()
        for w in self._writers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await w
        for ch in self._channels:
            ch.close()

    async def __aenter__(self) -> Link:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- internals ----------------------------------------------------------------------------
    async def _reserve(self, s: OutboundSession, num_bytes: int) -> None:
        cfg = self.config

        def fits() -> bool:
            # Always let one chunk through when nothing is in flight, or it could never go.
            return (
                s.bytes_queued - s.bytes_acked + num_bytes <= cfg.max_inflight_bytes_per_session
                or s.bytes_queued == s.bytes_acked
            ) and (
                self._inflight + num_bytes <= cfg.max_inflight_bytes_per_link or not self._inflight
            )

        if not fits():  # the common case skips building a wait
            await wait_until(
                self._signal, fits, lambda: s.error or self._error, cfg.timeout_s, "send window"
            )
        s.bytes_queued += num_bytes
        self._inflight += num_bytes
        self._counts[0] += num_bytes

    def _release(self, s: OutboundSession, num_bytes: int) -> None:
        """Bytes of ``s`` that will never be acknowledged (aborted) leave the window."""
        self._inflight -= num_bytes
        self._counts[3] += num_bytes

    def _enqueue(self, item: _Item) -> None:
        if self._unwritten == 0:
            self._backlog_from_s = self._loop.time()
        self._unwritten += item.chunk.length
        self._queue.put_nowait(item)

    def _left_queue(self, num_bytes: int) -> None:
        """``num_bytes`` of enqueued chunks were written (or will never be: skipped, lost)."""
        self._unwritten -= num_bytes
        if self._unwritten <= 0 and num_bytes > 0:
            self._unwritten = 0
            self._backlogged_s += self._loop.time() - self._backlog_from_s

    async def _write_control(self, ch: Channel, frame: F.Frame) -> None:
        if ch.closed or ch.codec.state is not ConnState.READY:
            raise ConnectionResetError("connection closed")
        try:
            await ch.write_frames([(frame, None)])
        except TimeoutError:
            ch.close(TimeoutError(f"no write progress for {self.config.timeout_s:g} s"))
            raise

    async def _writer(self, ch: Channel) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = self._take_batch(await self._queue.get())
            if not batch:
                continue
            num_bytes = sum(item.chunk.length for item in batch)
            try:  # the batch leaves the backlog once written, or when the write fails
                if self._bucket is not None:
                    wait_s = self._bucket.reserve(num_bytes, loop.time())
                    if wait_s > 0:
                        await asyncio.sleep(wait_s)
                await self._timed_write(ch, batch)
            except TimeoutError:  # the peer stopped reading: this stream is stuck for good
                ch.close(TimeoutError(f"no write progress for {self.config.timeout_s:g} s"))
                return
            except (ConnectionError, OSError, LocalProtocolError):
                return  # the connection is gone: on_closed fails the link and its sessions
            finally:
                self._left_queue(num_bytes)
            for item in batch:
                item.session.bytes_sent += item.chunk.length
            self._counts[1] += num_bytes

    async def _timed_write(self, ch: Channel, batch: list[_Item]) -> None:
        """Write ``batch``, counting the time any writer is inside a write: a write that returns
        at once costs nothing; one that waits for socket space is the network holding it back."""
        if self._writing == 0:
            self._writing_from_s = self._loop.time()
        self._writing += 1
        try:
            await ch.write_frames([(item.chunk, item.view) for item in batch])
        finally:
            self._writing -= 1
            if self._writing == 0:
                self._write_blocked_s += self._loop.time() - self._writing_from_s

    def _take_batch(self, first: _Item) -> list[_Item]:
        """``first`` and, if more chunks wait, up to this connection's share of them (at most
        ``_BATCH_BYTES``): written in one gather syscall, they cost one loop turn instead of one
        each (measured: docs/transfer.md), and the share keeps every connection busy. A paced
        link writes chunk by chunk: a batch would leave the token bucket as one burst."""
        items = [first] if not first.session.state.terminal else []
        skipped = 0 if items else first.chunk.length
        share = 0 if self._bucket is not None else self._queue.qsize() // len(self._channels)
        size = first.chunk.length
        while share > 0 and size < _BATCH_BYTES:
            item = self._queue.get_nowait()
            share -= 1
            if not item.session.state.terminal:  # an aborted session's credit is already freed
                items.append(item)
                size += item.chunk.length
            else:
                skipped += item.chunk.length
        self._left_queue(skipped)
        return items

    # -- ChannelHandler -----------------------------------------------------------------------
    def on_events(self, ch: Channel) -> None:
        while (ev := ch.codec.next_event()) is not None:
            match ev:
                case Authenticated():
                    ch.tag = "ready"
                case F.Accept(sid):
                    s = self._sessions.get(sid)
                    if s is not None and s.state is SessionState.OPENING:
                        s.state = advance(s.state, SessionState.STREAMING)
                case F.Ack(sid, num_bytes):
                    s = self._sessions.get(sid)
                    if s is not None and num_bytes > s.bytes_acked:
                        delta = num_bytes - s.bytes_acked
                        s.bytes_acked = num_bytes
                        self._inflight -= delta
                        self._counts[2] += delta
                case F.Complete(sid):
                    s = self._sessions.pop(sid, None)
                    if s is not None and s.state is SessionState.ENDED:
                        s.state = advance(s.state, SessionState.VERIFIED)
                        # ACKs may trail COMPLETE on other connections: settle the window now.
                        delta = s.bytes_queued - s.bytes_acked
                        s.bytes_acked = s.bytes_queued
                        self._inflight -= delta
                        self._counts[2] += delta
                case F.Abort(0, code, reason):
                    why = f"receiver closed the connection ({code.name}): {reason}"
                    self._fail(ConnectError(why))
                    ch.close(ConnectionResetError(why))
                    break
                case F.Abort(sid, code, reason):
                    s = self._sessions.get(sid)
                    if s is not None:
                        s._set_aborted(SessionAborted(code, reason, by_peer=True))
        self._signal.fire()

    def on_closed(self, ch: Channel, exc: BaseException | None) -> None:
        if not self._closed:
            self._fail(ConnectError(f"connection lost: {exc!r}"))

    def _fail(self, error: ConnectError) -> None:
        if self._error is None:
            self._error = error
        for s in list(self._sessions.values()):
            s._set_aborted(SessionAborted(AbortCode.CONNECTION_LOST, str(error)))
        self._signal.fire()


_BATCH_BYTES = 4 << 20


def pacer(rate_bytes_per_s: float, now_s: float) -> TokenBucket:
    """The token bucket a link paces with (``pacing.link_burst_bytes``)."""
    return TokenBucket(rate_bytes_per_s, link_burst_bytes(rate_bytes_per_s), now_s)
