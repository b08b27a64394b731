"""``Receiver``: accepts senders' connections and reassembles their sessions into consumer buffers.

Before a connection authenticates it holds at most ~1 KiB (the codec's pre-auth bound), at most
``max_pending_handshakes`` such connections are kept (the oldest cut for a new one; peers that
authenticated before keep rooms of their own: ``pending_handshakes``), and each is cut
``handshake_timeout_s`` after it was accepted; every connection that closes unauthenticated is
counted in
``num_handshake_failures`` and logged at WARNING with the peer's address and the reason.

On OPEN the receiver checks the manifest's size, then asks its consumer ``allocate(manifest)`` for
one writable buffer per layer; ``allocate`` may raise ``Refused(reason)``, which aborts the session
(REFUSED) before a payload byte moves. Chunk payloads are received straight into those buffers
(see ``channel``), MAC-verified, acknowledged; a layer is announced when all its bytes are
verified, and the session is handed over by ``complete()`` only after END, full coverage and the
digest check. Faults abort one session (with a readable reason, sent to the sender too) and leave
the others running; a broken connection aborts the sessions of its sender. A watchdog aborts
sessions that make no progress for ``stall_timeout_s``. asyncio; no policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType

from prfaas.transfer import frames as F
from prfaas.transfer.channel import Channel, ProtocolChannel
from prfaas.transfer.codec import Authenticated, ChunkReceived, Connection, ConnState, Role
from prfaas.transfer.config import TransferConfig
from prfaas.transfer.errors import (
    AbortCode,
    LocalProtocolError,
    ProtocolError,
    Refused,
    SessionAborted,
)
from prfaas.transfer.inbound import InboundSession, _Peer
from prfaas.transfer.manifest import Manifest
from prfaas.transfer.pending_handshakes import PendingHandshakes
from prfaas.transfer.session_state import SessionState

log = logging.getLogger("prfaas.transfer")
_LOG_WINDOW_S = 60.0
_LOG_PER_WINDOW = 10  # refused handshakes logged per window: a flood must not flood the log

Allocate = Callable[[Manifest], Sequence[object]]
"""The consumer's allocator: one writable buffer (bytearray, numpy array, tensor memory, ...) per
manifest layer, each exactly ``layer.num_bytes`` long; or raise ``Refused(reason)``."""


class Receiver:
    """Accepts authenticated senders and reassembles their sessions into consumer buffers."""

    def __init__(self, config: TransferConfig, allocate: Allocate) -> None:
        self.config = config
        self.allocate = allocate
        self._peers: dict[bytes, _Peer] = {}
        self._channels: set[Channel] = set()
        # Accepted, not authenticated yet.
        self._pending: PendingHandshakes[Channel] = PendingHandshakes(config.max_pending_handshakes)
        self._incoming: asyncio.Queue[InboundSession] = asyncio.Queue()
        self._server: asyncio.Server | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False
        self.num_handshake_failures = 0
        """Connections closed before authenticating (wrong key, garbage, oversize or missing
        HELLO, handshake timeout, over ``max_pending_handshakes``) since this receiver started."""
        self.bytes_verified = 0
        self._log_window_at_s = -_LOG_WINDOW_S
        self._logged_in_window = 0
        self._unlogged = 0

    # -- lifecycle ----------------------------------------------------------------------------
    async def __aenter__(self) -> Receiver:
        self._watchdog = asyncio.create_task(self._watch())
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def listen(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Start accepting connections; returns the bound (host, port)."""
        loop = asyncio.get_running_loop()
        tls = self.config.ssl_context
        self._server = await loop.create_server(
            self._new_protocol,
            host,
            port,
            ssl=tls,
            backlog=256,
            # asyncio's TLS handshake comes first (and holds a 256 KiB buffer): same deadline.
            ssl_handshake_timeout=self.config.handshake_timeout_s if tls is not None else None,
        )
        addr = self._server.sockets[0].getsockname()
        return addr[0], addr[1]

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        for peer in list(self._peers.values()):
            for s in list(peer.sessions.values()):
                self._abort(s, SessionAborted(AbortCode.SHUTDOWN, "receiver closing"), True)
        for ch in list(self._channels):
            ch.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.config.timeout_s):
                    await self._server.wait_closed()

    # -- consumer API -------------------------------------------------------------------------
    async def next_session(self, timeout_s: float | None = None) -> InboundSession:
        """The next accepted session (buffers allocated, bytes may still be arriving)."""
        async with asyncio.timeout(timeout_s or self.config.timeout_s):
            return await self._incoming.get()

    async def __aiter__(self) -> AsyncIterator[InboundSession]:
        while True:
            yield await self._incoming.get()

    # -- accounting ---------------------------------------------------------------------------
    @property
    def num_pending_handshakes(self) -> int:
        """Connections accepted and not yet authenticated."""
        return len(self._pending)

    def pre_auth_buffered_bytes(self) -> int:
        """Bytes the codecs of unauthenticated connections hold (each at most
        ``codec.PRE_AUTH_BUFFER_BYTES``)."""
        return sum(ch.codec.buffered_bytes for ch in self._pending)

    # -- channels -----------------------------------------------------------------------------
    def _codec(self) -> Connection:
        return Connection(
            Role.ACCEPTOR,
            self.config.psk,
            nonce=os.urandom(F.NONCE_BYTES),
            name=self.config.name,
            max_chunk_bytes=self.config.max_chunk_bytes,
        )

    def _new_protocol(self) -> ProtocolChannel:
        ch = ProtocolChannel(
            self._codec(), self, handshake_timeout_s=self.config.handshake_timeout_s
        )
        self._adopt(ch)  # when full, the oldest pending connection is cut, not this one
        return ch

    def _adopt(self, ch: Channel) -> None:
        """Take a new, unauthenticated channel (from the listener, or an in-memory pair)."""
        ch.codec.chunk_sink = self._sink_for(ch)
        self._channels.add(ch)
        self._pending.admit(ch)

    def _sink_for(self, ch: Channel) -> Callable[[F.Chunk], memoryview | None]:
        def sink(chunk: F.Chunk) -> memoryview | None:
            peer = ch.tag
            assert isinstance(peer, _Peer)  # the codec allows CHUNK only after authentication
            s = peer.sessions.get(chunk.session_id)
            if s is None:
                if chunk.session_id in peer.finished:
                    return None  # aborted or done: read and drop, keep the stream in step
                raise ProtocolError(f"chunk for unknown session {chunk.session_id}")
            try:
                return s.assembly.sink(chunk)
            except SessionAborted as err:
                self._abort(s, err, tell_peer=True)
                return None

        return sink

    # -- ChannelHandler -----------------------------------------------------------------------
    def on_events(self, ch: Channel) -> None:
        if ch.codec.peer_name and ch in self._pending:  # its HELLO came: a returning peer?
            self._pending.hello(ch, ch.codec.peer_name)
        while (ev := ch.codec.next_event()) is not None:
            match ev:
                case Authenticated(peer_id, peer_name):
                    self._pending.authenticated(ch, peer_name)
                    peer = self._peers.get(peer_id) or self._peers.setdefault(
                        peer_id, _Peer(peer_id)
                    )
                    peer.channels.append(ch)
                    ch.tag = peer
                case ChunkReceived(chunk, sink, valid):
                    if sink is not None:
                        self._on_chunk(ch, chunk, valid)
                case F.Open():
                    self._on_open(ch, ev)
                case F.End():
                    self._on_end(ch, ev)
                case F.Abort(0, code, reason):
                    ch.close(ConnectionResetError(f"sender aborted ({code.name}): {reason}"))
                    return
                case F.Abort(sid, code, reason):
                    s = self._session(ch, sid)
                    if s is not None:
                        self._abort(s, SessionAborted(code, reason, by_peer=True), False)

    def on_closed(self, ch: Channel, exc: BaseException | None) -> None:
        self._channels.discard(ch)
        self._pending.discard(ch)
        peer = ch.tag
        if peer is None and not self._closed:  # before authenticating: key, garbage, timeout
            self._handshake_failed(ch, exc)
        if not isinstance(peer, _Peer):
            return
        with contextlib.suppress(ValueError):
            peer.channels.remove(ch)
        reason = f"a connection of this sender broke: {exc!r}"
        for s in list(peer.sessions.values()):
            self._abort(s, SessionAborted(AbortCode.CONNECTION_LOST, reason), tell_peer=True)
        if not peer.channels:
            self._peers.pop(peer.peer_id, None)

    def _handshake_failed(self, ch: Channel, exc: BaseException | None) -> None:
        self.num_handshake_failures += 1
        now = asyncio.get_running_loop().time()
        if now - self._log_window_at_s >= _LOG_WINDOW_S:
            self._log_window_at_s, self._logged_in_window = now, 0
        if self._logged_in_window >= _LOG_PER_WINDOW:
            self._unlogged += 1
            return
        self._logged_in_window += 1
        reason = (str(exc) or type(exc).__name__) if exc is not None else "closed"
        more = f" ({self._unlogged} more refused since, not logged)" if self._unlogged else ""
        self._unlogged = 0
        log.warning(
            "KV handshake from %s refused (%s total): %s%s",
            ch.peer_address(),
            self.num_handshake_failures,
            reason,
            more,
        )

    # -- session events -----------------------------------------------------------------------
    def _session(self, ch: Channel, sid: int) -> InboundSession | None:
        peer = ch.tag
        return peer.sessions.get(sid) if isinstance(peer, _Peer) else None

    def _send(self, ch: Channel, frame: F.Frame) -> None:
        if ch.closed:
            return
        try:
            data = ch.codec.send(frame)
        except LocalProtocolError:
            return  # the connection failed a moment ago; it is being closed
        ch.write_nowait(data)

    def _on_open(self, ch: Channel, ev: F.Open) -> None:
        peer = ch.tag
        assert isinstance(peer, _Peer)
        old = peer.sessions.get(ev.session_id)
        if old is not None or ev.session_id in peer.finished:
            why = f"duplicate OPEN of session {ev.session_id}"
            if old is not None:
                self._abort(old, SessionAborted(AbortCode.PROTOCOL, why), tell_peer=True)
            else:
                self._send(ch, F.Abort(ev.session_id, AbortCode.PROTOCOL, why))
            return
        s = InboundSession(self, peer, ev.session_id, ev.manifest)
        too_many = len(peer.sessions) >= self.config.max_sessions_per_peer
        peer.sessions[ev.session_id] = s
        m = ev.manifest
        try:
            if too_many:
                raise SessionAborted(AbortCode.REFUSED, "too many open sessions from this sender")
            if m.num_bytes > self.config.max_session_bytes:
                raise SessionAborted(
                    AbortCode.TOO_LARGE,
                    f"manifest of {m.num_bytes} bytes exceeds {self.config.max_session_bytes}",
                )
            try:
                buffers = self.allocate(m)
            except Refused as exc:
                raise SessionAborted(AbortCode.REFUSED, exc.reason) from None
            except Exception as exc:  # the consumer's bug must not take the receiver down
                raise SessionAborted(AbortCode.INTERNAL, f"allocate failed: {exc!r}") from None
            s.assembly.accept(buffers)
        except SessionAborted as err:
            self._abort(s, err, tell_peer=True)
            return
        self._send(ch, F.Accept(ev.session_id))
        self._incoming.put_nowait(s)

    def _on_chunk(self, ch: Channel, chunk: F.Chunk, valid: bool) -> None:
        s = self._session(ch, chunk.session_id)
        if s is None or s.state.terminal:
            return
        try:
            layer_done = s.assembly.chunk_arrived(chunk, valid)
        except SessionAborted as err:
            self._abort(s, err, tell_peer=True)
            return
        s.progress_at_s = asyncio.get_running_loop().time()
        self.bytes_verified += chunk.length
        if layer_done:
            s._changed()
        if not self._maybe_verified(ch, s):
            self._ack_later(ch, s)

    def _ack_later(self, ch: Channel, s: InboundSession) -> None:
        """Acknowledge every ``ack_every_bytes``, or ``ack_delay_s`` after the first unacknowledged
        byte (a delayed ACK: one small frame per chunk cost a syscall and a wakeup on each side)."""
        unacked = s.assembly.verified_bytes - s._acked_bytes
        if unacked >= self.config.ack_every_bytes:
            self._ack_now(ch, s)
        elif s._ack_timer is None:
            s._ack_timer = asyncio.get_running_loop().call_later(
                self.config.ack_delay_s, self._ack_now, ch, s
            )

    def _ack_now(self, ch: Channel, s: InboundSession) -> None:
        if s._ack_timer is not None:
            s._ack_timer.cancel()
            s._ack_timer = None
        if s.error is None and s.assembly.verified_bytes > s._acked_bytes:
            s._acked_bytes = s.assembly.verified_bytes
            self._send(ch, F.Ack(s.session_id, s._acked_bytes))

    def _on_end(self, ch: Channel, ev: F.End) -> None:
        s = self._session(ch, ev.session_id)
        peer = ch.tag
        if s is None and isinstance(peer, _Peer) and ev.session_id in peer.finished:
            return  # e.g. we aborted it while the sender was finishing
        if s is None:
            why = f"END of unknown session {ev.session_id}"
            self._send(ch, F.Abort(ev.session_id, AbortCode.PROTOCOL, why))
            return
        if s.state.terminal:
            return
        try:
            s.assembly.end(ev)
        except SessionAborted as err:
            self._abort(s, err, tell_peer=True)
            return
        s.progress_at_s = asyncio.get_running_loop().time()
        self._maybe_verified(ch, s)

    def _maybe_verified(self, ch: Channel, s: InboundSession) -> bool:
        try:
            done = s.assembly.try_verify()
        except SessionAborted as err:
            self._abort(s, err, tell_peer=True)
            return True
        if done:
            s._peer.retire(s)
            if s._ack_timer is not None:
                s._ack_timer.cancel()
                s._ack_timer = None
            s._verified()
            self._send(ch, F.Complete(s.session_id))  # settles the sender's window too
        return done

    def _abort(self, s: InboundSession, err: SessionAborted, tell_peer: bool) -> None:
        # The assembly may already be ABORTED (it raised ``err``); ``error`` says if we handled it.
        if s.error is not None or s.state is SessionState.VERIFIED:
            return
        s.assembly.abort()
        s.assembly.buffers = ()  # never touch the consumer's memory again ...
        for ch in s._peer.channels:  # ... not even the rest of a chunk now arriving
            ch.codec.discard_payload_of(s.session_id)
        if s._ack_timer is not None:
            s._ack_timer.cancel()
            s._ack_timer = None
        s.error = err
        s._peer.retire(s)
        if tell_peer:  # on a connection still in step (not one that just failed its MAC)
            live = [ch for ch in s._peer.channels if ch.codec.state is ConnState.READY]
            for ch in live[:1]:
                self._send(ch, F.Abort(s.session_id, err.code, err.reason))
        s._changed()

    async def _watch(self) -> None:
        """Abort sessions with no progress for ``stall_timeout_s`` (a stalled or dead sender)."""
        loop = asyncio.get_running_loop()
        period = min(1.0, self.config.stall_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for peer in list(self._peers.values()):
                for s in list(peer.sessions.values()):
                    idle = now - s.progress_at_s
                    if idle > self.config.stall_timeout_s:
                        why = f"stalled: no bytes for {idle:.1f} s"
                        self._abort(s, SessionAborted(AbortCode.TIMEOUT, why), tell_peer=True)
