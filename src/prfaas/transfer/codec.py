"""Sans-I/O connection: bytes in -> events out, frames in -> bytes out, one state machine.

``Connection`` owns a connection's framing and its state (``ConnState``, changed only through the
one ``TRANSITIONS`` table) including the HMAC handshake. It touches no socket and no clock: a driver
(asyncio engine, in-memory transport, test) feeds it bytes split at any boundary through either
``receive_data(bytes)`` or the zero-copy pair ``get_buffer()`` / ``buffer_updated(n)`` (the shape
of ``asyncio.BufferedProtocol``). When a CHUNK's meta is parsed the codec asks ``chunk_sink`` for
the destination of its payload, and then hands out that destination as the next receive buffer, so
payload bytes land in the consumer's memory with no copy beyond the first few KiB.

Only ``ProtocolError`` (and its subclasses) escapes for bad input. Pure: no asyncio, no I/O.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from prfaas.transfer import frames as F
from prfaas.transfer.errors import (
    AbortCode,
    AuthenticationFailed,
    FrameTooLarge,
    LocalProtocolError,
    ProtocolError,
)


class Role(enum.Enum):
    INITIATOR = "initiator"
    """Dials out; sends sessions (the KV sender)."""
    ACCEPTOR = "acceptor"
    """Listens; receives sessions (the KV receiver)."""


class ConnState(enum.Enum):
    AWAIT_HELLO = "await_hello"
    HELLO_SENT = "hello_sent"
    CHALLENGE_SENT = "challenge_sent"
    AUTH_SENT = "auth_sent"
    READY = "ready"
    CLOSED = "closed"
    """A connection-level ABORT was sent or received."""
    FAILED = "failed"
    """The peer violated the protocol; nothing more is read."""


class Dir(enum.Enum):
    SEND = "send"
    RECV = "recv"


_I, _A = Role.INITIATOR, Role.ACCEPTOR
_S, _R = Dir.SEND, Dir.RECV
_T = F.FrameType
_C = ConnState
# The one transition table: (role, state, direction, frame type) -> next state. Anything absent is
# a protocol violation (received) or a caller bug (sent). A connection-level ABORT (session 0)
# always leads to CLOSED and is handled before the table; session ABORTs keep the state.
TRANSITIONS: dict[tuple[Role, ConnState, Dir, F.FrameType], ConnState] = {
    (_I, _C.AWAIT_HELLO, _S, _T.HELLO): _C.HELLO_SENT,
    (_I, _C.HELLO_SENT, _R, _T.CHALLENGE): _C.AUTH_SENT,  # proof checked, AUTH queued
    (_I, _C.AUTH_SENT, _R, _T.READY): _C.READY,
    **{(_I, _C.READY, _S, t): _C.READY for t in (_T.OPEN, _T.CHUNK, _T.END, _T.ABORT)},
    **{(_I, _C.READY, _R, t): _C.READY for t in (_T.ACCEPT, _T.ACK, _T.COMPLETE, _T.ABORT)},
    (_A, _C.AWAIT_HELLO, _R, _T.HELLO): _C.CHALLENGE_SENT,  # CHALLENGE queued
    (_A, _C.CHALLENGE_SENT, _R, _T.AUTH): _C.READY,  # proof checked, READY queued
    **{(_A, _C.READY, _R, t): _C.READY for t in (_T.OPEN, _T.CHUNK, _T.END, _T.ABORT)},
    **{(_A, _C.READY, _S, t): _C.READY for t in (_T.ACCEPT, _T.ACK, _T.COMPLETE, _T.ABORT)},
}


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The handshake finished: both sides proved the key. ``peer_id`` groups one sender's
    connections (its sessions are striped across them)."""

    peer_id: bytes
    name: str


@dataclass(frozen=True, slots=True)
class ChunkReceived:
    """A CHUNK's payload has fully arrived in ``sink`` (None: it was discarded). ``valid`` says
    whether it matched its checksum, computed piece by piece as the bytes landed (while they are
    still in cache: a second pass over cold memory cost more than the copy itself)."""

    chunk: F.Chunk
    sink: memoryview | None
    valid: bool = False


Event = Authenticated | ChunkReceived | F.Open | F.Accept | F.End | F.Ack | F.Complete | F.Abort
ChunkSink = Callable[[F.Chunk], memoryview | None]
"""Given a chunk's meta, return a writable view of exactly ``chunk.length`` bytes for its payload,
or None to discard the payload (e.g. its session was aborted). May raise ProtocolError."""

_LABEL = b"prfaas-kv-v1 "
_SCRATCH_BYTES = 16 << 10
_DISCARD_BYTES = 256 << 10


def proof(psk: bytes, who: bytes, first_nonce: bytes, second_nonce: bytes, peer_id: bytes) -> bytes:
    """HMAC-SHA256 over a role label, both nonces and the initiator's peer id."""
    msg = _LABEL + who + first_nonce + second_nonce + peer_id
    return hmac.new(psk, msg, hashlib.sha256).digest()


class _Phase(enum.Enum):
    HEADER = 0
    BODY = 1
    META = 2
    PAYLOAD = 3


def _no_sink(chunk: F.Chunk) -> memoryview | None:
    raise ProtocolError(f"unexpected CHUNK for session {chunk.session_id}")


class Connection:
    """One end of one connection. ``nonce`` is 16 random bytes supplied by the driver."""

    def __init__(
        self,
        role: Role,
        psk: bytes,
        *,
        nonce: bytes,
        peer_id: bytes = b"\0" * F.PEER_ID_BYTES,
        name: str = "",
        chunk_sink: ChunkSink = _no_sink,
        max_chunk_bytes: int = F.MAX_CHUNK_BYTES,
    ) -> None:
        if not psk:
            raise ValueError("the pre-shared key must not be empty")
        if len(nonce) != F.NONCE_BYTES or len(peer_id) != F.PEER_ID_BYTES:
            raise ValueError("nonce and peer_id must be 16 bytes each")
        self.role = role
        self.state = ConnState.AWAIT_HELLO
        self.peer_id = peer_id
        self.peer_name = ""
        self._psk = psk
        self._nonce = nonce
        self._name = name
        self._peer_nonce = b""
        self.chunk_sink = chunk_sink
        self._max_chunk_bytes = min(max_chunk_bytes, F.MAX_CHUNK_BYTES)
        self._buf = bytearray(_SCRATCH_BYTES)
        self._discard = bytearray(0)
        self._start = 0
        self._end = 0
        self._phase = _Phase.HEADER
        self._type = F.FrameType.READY
        self._body_len = 0
        self._chunk: F.Chunk | None = None
        self._sink: memoryview | None = None
        self._hasher = xxhash.xxh3_64()
        self._filled = 0
        self._direct = False
        self._events: deque[Event] = deque()
        self._outbox = bytearray()
        self.bytes_received = 0

    # -- sending ------------------------------------------------------------------------------
    def initiate(self) -> bytes:
        """Initiator only: the HELLO that opens the handshake."""
        if self.role is not Role.INITIATOR:
            raise LocalProtocolError("only the initiator sends HELLO")
        hello = F.Hello(self.peer_id, self._nonce, self._name)
        return self.send(hello)

    def send(self, frame: F.Frame) -> bytes:
        """Bytes for ``frame`` (for a CHUNK: header + meta; the payload goes right after)."""
        ftype = F.FRAME_TYPE[type(frame)]
        if isinstance(frame, F.Abort) and frame.session_id == 0:
            self.state = ConnState.CLOSED
            return F.encode_frame(frame)
        nxt = TRANSITIONS.get((self.role, self.state, Dir.SEND, ftype))
        if nxt is None:
            raise LocalProtocolError(f"{self.role.value} may not send {ftype.name} in {self.state}")
        if isinstance(frame, F.Chunk) and not 0 < frame.length <= self._max_chunk_bytes:
            raise LocalProtocolError(f"chunk length {frame.length} out of range")
        self.state = nxt
        return F.encode_frame(frame)

    def data_to_send(self) -> bytes:
        """Handshake replies produced while receiving; the driver writes them out."""
        out = bytes(self._outbox)
        self._outbox.clear()
        return out

    # -- receiving ----------------------------------------------------------------------------
    def receive_data(self, data: bytes | memoryview) -> None:
        """Feed bytes (any split). Events become available from ``next_event``."""
        view = memoryview(data).cast("B")
        while view:
            buf = self.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            self.buffer_updated(n)
            view = view[n:]

    def discard_payload_of(self, session_id: int) -> None:
        """If the chunk being received belongs to ``session_id``, send the rest of its payload to
        the discard buffer: once a session is aborted its consumer may reuse the memory at once, so
        not one more byte may land there. (Call between ``buffer_updated`` calls.)"""
        if self._chunk is not None and self._chunk.session_id == session_id:
            self._sink = None

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def events(self) -> list[Event]:
        out = list(self._events)
        self._events.clear()
        return out

    def payload_bytes_expected(self) -> int:
        """Bytes of the CHUNK payload now arriving that are still to come (0 between payloads):
        the stream will certainly carry that many, so a channel may sleep until they are there."""
        if self._phase is _Phase.PAYLOAD and self._start == self._end:
            return self._body_len - F.CHUNK_META_BYTES - self._filled
        return 0

    def get_buffer(self) -> memoryview:
        """Where the next received bytes should go (never empty)."""
        self._check_alive()
        if self._phase is _Phase.PAYLOAD and self._start == self._end:
            self._direct = True
            remaining = self._body_len - F.CHUNK_META_BYTES - self._filled
            if self._sink is not None:
                return self._sink[self._filled :]
            if not self._discard:
                self._discard = bytearray(_DISCARD_BYTES)
            return memoryview(self._discard)[: min(remaining, _DISCARD_BYTES)]
        self._direct = False
        if self._end == len(self._buf):
            self._compact(len(self._buf) + 1)
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, num_bytes: int) -> None:
        """``num_bytes`` were written into the last ``get_buffer()``. Parses what is complete."""
        self._check_alive()
        self.bytes_received += num_bytes
        try:
            if self._direct:
                if self._sink is not None:
                    self._hasher.update(self._sink[self._filled : self._filled + num_bytes])
                self._filled += num_bytes
                self._maybe_chunk_done()
            else:
                self._end += num_bytes
                self._parse()
        except ProtocolError:
            self.state = ConnState.FAILED
            raise
        except Exception as exc:  # a bug or a sink failure: still a protocol-level failure
            self.state = ConnState.FAILED
            raise ProtocolError(f"internal error while parsing: {exc!r}") from exc

    # -- internals ----------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.state is ConnState.FAILED:
            raise ProtocolError("connection already failed")
        if self.state is ConnState.CLOSED:
            raise ProtocolError("connection closed by ABORT")

    def _compact(self, need: int) -> None:
        """Move unread bytes to the front; grow so that ``need`` bytes fit."""
        unread = self._end - self._start
        size = max(len(self._buf), need)
        if size != len(self._buf) or self._start:
            new = bytearray(size)
            new[:unread] = self._buf[self._start : self._end]
            self._buf = new
            self._start, self._end = 0, unread

    def _parse(self) -> None:
        while self.state not in (ConnState.CLOSED, ConnState.FAILED):
            avail = self._end - self._start
            if self._phase is _Phase.HEADER:
                if avail < F.HEADER_BYTES:
                    break
                self._read_header()
            elif self._phase is _Phase.BODY:
                if avail < self._body_len:
                    if len(self._buf) - self._start < self._body_len:
                        self._compact(self._body_len)
                    break
                body = memoryview(self._buf)[self._start : self._start + self._body_len]
                frame = F.decode_body(self._type, body)
                self._start += self._body_len
                self._phase = _Phase.HEADER
                self._on_frame(frame)
            elif self._phase is _Phase.META:
                if avail < F.CHUNK_META_BYTES:
                    break
                self._read_meta()
            else:
                remaining = self._body_len - F.CHUNK_META_BYTES - self._filled
                take = min(avail, remaining)
                if self._sink is not None:
                    piece = memoryview(self._buf)[self._start : self._start + take]
                    self._sink[self._filled : self._filled + take] = piece
                    self._hasher.update(piece)
                    piece.release()
                self._start += take
                self._filled += take
                if not self._maybe_chunk_done():
                    break
        if self._start == self._end:
            self._start = self._end = 0

    def _read_header(self) -> None:
        magic, version, ftype, body_len = F.HEADER.unpack_from(self._buf, self._start)
        if magic != F.MAGIC:
            raise ProtocolError(f"bad magic {magic!r}: not a prfaas KV stream")
        if version != F.VERSION:
            raise ProtocolError(f"unsupported wire version {version} (we speak {F.VERSION})")
        try:
            frame_type = F.FrameType(ftype)
        except ValueError:
            raise ProtocolError(f"unknown frame type {ftype}") from None
        if frame_type is F.FrameType.CHUNK:
            payload = body_len - F.CHUNK_META_BYTES
            if payload > self._max_chunk_bytes:
                raise FrameTooLarge(f"chunk of {payload} bytes, limit {self._max_chunk_bytes}")
            if payload <= 0:
                raise ProtocolError(f"CHUNK body of {body_len} bytes has no payload")
        elif body_len > F.MAX_CONTROL_BODY_BYTES:
            raise FrameTooLarge(f"{frame_type.name} body of {body_len} bytes")
        # Check the state table before reading the body: an unauthenticated peer's CHUNK is refused
        # here, before a byte of its payload is looked at.
        if frame_type is not F.FrameType.ABORT:
            self._next_state(frame_type)
        self._start += F.HEADER_BYTES
        self._type = frame_type
        self._body_len = body_len
        self._phase = _Phase.META if frame_type is F.FrameType.CHUNK else _Phase.BODY

    def _next_state(self, frame_type: F.FrameType) -> ConnState:
        nxt = TRANSITIONS.get((self.role, self.state, Dir.RECV, frame_type))
        if nxt is None:
            if self.state in (ConnState.AWAIT_HELLO, ConnState.CHALLENGE_SENT):
                raise AuthenticationFailed(f"{frame_type.name} before authentication")
            raise ProtocolError(f"{frame_type.name} not allowed in state {self.state.value}")
        return nxt

    def _read_meta(self) -> None:
        meta = memoryview(self._buf)[self._start : self._start + F.CHUNK_META_BYTES]
        chunk = F.decode_chunk_meta(meta)
        self._hasher.reset()
        self._hasher.update(meta[: F.CHUNK_META.size])
        meta.release()
        self._start += F.CHUNK_META_BYTES
        if chunk.length != self._body_len - F.CHUNK_META_BYTES:
            raise ProtocolError(f"chunk length {chunk.length} disagrees with frame length")
        sink = self.chunk_sink(chunk)
        if sink is not None and len(sink) != chunk.length:
            raise ProtocolError(f"sink of {len(sink)} bytes for a {chunk.length}-byte chunk")
        self._chunk, self._sink, self._filled = chunk, sink, 0
        self._phase = _Phase.PAYLOAD

    def _maybe_chunk_done(self) -> bool:
        if self._filled < self._body_len - F.CHUNK_META_BYTES:
            return False
        assert self._chunk is not None
        valid = self._sink is not None and self._hasher.intdigest() == self._chunk.checksum
        self._events.append(ChunkReceived(self._chunk, self._sink, valid))
        self._chunk, self._sink = None, None
        self._phase = _Phase.HEADER
        self._direct = False
        return True

    def _on_frame(self, frame: F.Frame) -> None:
        if isinstance(frame, F.Abort):
            if frame.session_id == 0 or self.state is not ConnState.READY:
                self.state = ConnState.CLOSED
            self._events.append(frame)
            return
        self.state = self._next_state(F.FRAME_TYPE[type(frame)])
        match frame:
            case F.Hello():
                self._on_hello(frame)
            case F.Challenge():
                self._on_challenge(frame)
            case F.Auth():
                self._on_auth(frame)
            case F.Ready():
                self._events.append(Authenticated(self.peer_id, self.peer_name))
            case F.Open() | F.Accept() | F.End() | F.Ack() | F.Complete():
                self._events.append(frame)
            case _:
                raise ProtocolError(f"unexpected {type(frame).__name__}")

    def _on_hello(self, hello: F.Hello) -> None:
        self.peer_id, self.peer_name, self._peer_nonce = hello.peer_id, hello.name, hello.nonce
        mine = proof(self._psk, b"acceptor", hello.nonce, self._nonce, hello.peer_id)
        self._outbox += F.encode_frame(F.Challenge(self._nonce, mine))

    def _on_challenge(self, ch: F.Challenge) -> None:
        expected = proof(self._psk, b"acceptor", self._nonce, ch.nonce, self.peer_id)
        if not hmac.compare_digest(expected, ch.proof):
            raise AuthenticationFailed("the acceptor does not know our pre-shared key")
        mine = proof(self._psk, b"initiator", ch.nonce, self._nonce, self.peer_id)
        self._outbox += F.encode_frame(F.Auth(mine))

    def _on_auth(self, auth: F.Auth) -> None:
        expected = proof(self._psk, b"initiator", self._nonce, self._peer_nonce, self.peer_id)
        if not hmac.compare_digest(expected, auth.proof):
            self._outbox += F.encode_frame(F.Abort(0, AbortCode.AUTH, "authentication failed"))
            raise AuthenticationFailed("the initiator does not know our pre-shared key")
        self._outbox += F.encode_frame(F.Ready())
        self._events.append(Authenticated(self.peer_id, self.peer_name))
