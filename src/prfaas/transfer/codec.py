"""Sans-I/O connection: bytes in -> events out, frames in -> bytes out, one state machine.

``Connection`` owns a connection's framing and its state (``ConnState``, changed only through the
one ``TRANSITIONS`` table of ``conn_state``) including the HMAC handshake (its proofs and keys:
``handshake``), and the MAC of every frame after it: each end derives per-direction keys from the
handshake (``mac``), tags every frame it sends and verifies every frame it receives, in wire order
(the sequence number is the GCM IV). It touches no socket
and no clock: a driver (asyncio engine, in-memory transport, test) feeds it bytes split at any
boundary through either
``receive_data(bytes)`` or the zero-copy pair ``get_buffer()`` / ``buffer_updated(n)`` (the shape
of ``asyncio.BufferedProtocol``). When a CHUNK's meta is parsed the codec asks ``chunk_sink`` for
the destination of its payload, and then hands out that destination as the next receive buffer, so
payload bytes land in the consumer's memory with no copy beyond the first few KiB; the payload's
MAC is computed piece by piece as the bytes land, and ``ChunkReceived.valid`` is its verdict.

Before authentication a connection holds at most ``PRE_AUTH_BUFFER_BYTES`` (every pre-auth frame
type has a small body limit, checked at the header), so an unauthenticated peer cannot make the
codec allocate more; the 16 KiB receive scratch is grown only once the peer proved the key.

Only ``ProtocolError`` (and its subclasses) escapes for bad input. Pure: no asyncio, no I/O.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prfaas.transfer import frames as F
from prfaas.transfer.conn_state import TRANSITIONS, ConnState, Dir, Role
from prfaas.transfer.errors import (
    AbortCode,
    AuthenticationFailed,
    FrameTooLarge,
    IntegrityError,
    LocalProtocolError,
    ProtocolError,
)
from prfaas.transfer.handshake import (
    FrameMacs,
    acceptor_challenge,
    acceptor_macs,
    initiator_auth,
    initiator_proof_valid,
)
from prfaas.transfer.mac import FrameMac, GmacStream, tags_equal


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The handshake finished: both sides proved the key. ``peer_id`` groups one sender's
    connections (its sessions are striped across them)."""

    peer_id: bytes
    name: str


@dataclass(frozen=True, slots=True)
class ChunkReceived:
    """A CHUNK's payload has fully arrived in ``sink`` (None: it was discarded). ``valid`` says
    whether the frame matched its MAC, computed piece by piece as the bytes landed (while they are
    still in cache: a second pass over cold memory cost more than the copy itself). An invalid
    chunk's bytes are in ``sink`` but unverified: its session must be aborted, and right after
    this event the codec raises ``IntegrityError`` (a frame that fails its MAC ends the
    connection, as a bad record MAC ends a TLS connection)."""

    chunk: F.Chunk
    sink: memoryview | None
    valid: bool = False


Event = Authenticated | ChunkReceived | F.Open | F.Accept | F.End | F.Ack | F.Complete | F.Abort
ChunkSink = Callable[[F.Chunk], memoryview | None]
"""Given a chunk's meta, return a writable view of exactly ``chunk.length`` bytes for its payload,
or None to discard the payload (e.g. its session was aborted). May raise ProtocolError."""

_EMPTY = memoryview(b"")
_SCRATCH_BYTES = 16 << 10
_DISCARD_BYTES = 256 << 10
PRE_AUTH_BUFFER_BYTES = 1024
"""A connection's whole receive buffer until the peer is authenticated (>= the largest pre-auth
frame, ``frames.PRE_AUTH_FRAME_BYTES``)."""
assert F.PRE_AUTH_FRAME_BYTES <= PRE_AUTH_BUFFER_BYTES


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
        self._buf = bytearray(PRE_AUTH_BUFFER_BYTES)
        self._discard = bytearray(0)
        self._start = 0
        self._end = 0
        self._phase = _Phase.HEADER
        self._type = F.FrameType.READY
        self._body_len = 0
        self._chunk: F.Chunk | None = None
        self._sink: memoryview | None = None
        self._keys: FrameMacs | None = None  # (send, receive), once derived
        self._tx_mac: FrameMac | None = None  # set when READY: every later frame is tagged
        self._rx_mac: FrameMac | None = None
        self._stream: GmacStream | None = None  # the MAC of the chunk now arriving
        self._landing = _EMPTY  # the payload buffer last handed out by get_buffer
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

    def send(self, frame: F.Frame, payload: F.Buffer | None = None) -> bytes:
        """Bytes for ``frame``, tagged once authenticated (for a CHUNK: header + meta with the tag
        over ``payload`` too; the caller writes ``payload`` right after). Frames must reach the wire
        in the order of their ``send`` calls: each takes the next sequence number."""
        ftype = F.FRAME_TYPE[type(frame)]
        if isinstance(frame, F.Abort) and frame.session_id == 0:
            self.state = ConnState.CLOSED
            return self._seal(frame, None)
        nxt = TRANSITIONS.get((self.role, self.state, Dir.SEND, ftype))
        if nxt is None:
            raise LocalProtocolError(f"{self.role.value} may not send {ftype.name} in {self.state}")
        if isinstance(frame, F.Chunk):
            if not 0 < frame.length <= self._max_chunk_bytes:
                raise LocalProtocolError(f"chunk length {frame.length} out of range")
            if payload is None or memoryview(payload).nbytes != frame.length:
                raise LocalProtocolError(f"a {frame.length}-byte chunk needs its payload")
        self.state = nxt
        return self._seal(frame, payload)

    def _seal(self, frame: F.Frame, payload: F.Buffer | None) -> bytes:
        mac = self._tx_mac
        if mac is None:  # the handshake, or an ABORT before it
            return F.encode_frame(frame)
        if isinstance(frame, F.Chunk):
            assert payload is not None
            head = F.header(F.FrameType.CHUNK, F.CHUNK_META_BYTES + frame.length)
            meta = F.chunk_meta(frame)
            stream = mac.stream()
            stream.update(head)
            stream.update(meta)
            stream.update(payload)
            return head + meta + stream.tag()
        body = F.encode_body(frame)
        covered = F.header(F.FRAME_TYPE[type(frame)], len(body) + F.TAG_BYTES) + body
        return covered + mac.tag(covered)

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

    @property
    def authenticated(self) -> bool:
        """The peer proved the key: frames are tagged from here on."""
        return self._rx_mac is not None

    @property
    def buffered_bytes(self) -> int:
        """Bytes this codec holds for the connection (receive buffer, discard scratch, replies):
        at most ``PRE_AUTH_BUFFER_BYTES`` before authentication."""
        return len(self._buf) + len(self._discard) + len(self._outbox)

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
                self._landing = self._sink[self._filled :]
            else:
                if not self._discard:
                    self._discard = bytearray(_DISCARD_BYTES)
                self._landing = memoryview(self._discard)[: min(remaining, _DISCARD_BYTES)]
            return self._landing
        self._direct = False
        if self._end == len(self._buf):  # move unread bytes to the front; grow only if none read
            self._compact(len(self._buf) + (1 if self._start == 0 else 0))
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, num_bytes: int) -> None:
        """``num_bytes`` were written into the last ``get_buffer()``. Parses what is complete."""
        self._check_alive()
        self.bytes_received += num_bytes
        try:
            if self._direct:
                # The MAC covers exactly the bytes that landed, in the sink or (discarded) not.
                assert self._stream is not None
                self._stream.update(self._landing[:num_bytes])
                self._landing = _EMPTY
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
                frame = F.decode_body(self._type, self._verified_body())
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
                piece = memoryview(self._buf)[self._start : self._start + take]
                if self._sink is not None:
                    self._sink[self._filled : self._filled + take] = piece
                assert self._stream is not None
                self._stream.update(piece)
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
        else:
            limit = F.MAX_BODY_BYTES[frame_type]
            if body_len > limit:  # before a byte of it is buffered (HELLO: 98 bytes at most)
                raise FrameTooLarge(f"{frame_type.name} body of {body_len} bytes, limit {limit}")
            if self._rx_mac is not None and body_len < F.TAG_BYTES:
                raise ProtocolError(f"{frame_type.name} body of {body_len} bytes has no MAC")
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

    def _verified_body(self) -> memoryview:
        """The body now complete in the buffer, its MAC checked and stripped once authenticated."""
        body = memoryview(self._buf)[self._start : self._start + self._body_len]
        if self._rx_mac is None:
            return body
        n = self._body_len - F.TAG_BYTES
        covered = F.header(self._type, self._body_len) + bytes(body[:n])
        if not tags_equal(self._rx_mac.tag(covered), body[n:]):
            raise IntegrityError(
                f"{self._type.name} frame failed its MAC: changed, replayed, reordered or dropped "
                "on the wire"
            )
        return body[:n]

    def _read_meta(self) -> None:
        meta = memoryview(self._buf)[self._start : self._start + F.CHUNK_META_BYTES]
        chunk = F.decode_chunk_meta(meta)
        assert self._rx_mac is not None  # CHUNK is allowed only once authenticated
        self._stream = self._rx_mac.stream()
        self._stream.update(F.header(F.FrameType.CHUNK, self._body_len))
        self._stream.update(meta[: F.CHUNK_META.size])
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
        chunk, stream = self._chunk, self._stream
        assert chunk is not None and stream is not None
        valid = tags_equal(stream.tag(), chunk.tag)
        self._events.append(ChunkReceived(chunk, self._sink, valid))
        self._chunk, self._sink, self._stream = None, None, None
        self._phase = _Phase.HEADER
        self._direct = False
        if not valid:  # the event goes first, so the session the bytes landed in is named
            end = chunk.offset + chunk.length
            raise IntegrityError(
                f"CHUNK of session {chunk.session_id} (layer {chunk.layer} bytes "
                f"[{chunk.offset}, {end})) failed its MAC: changed, replayed, reordered or dropped "
                "on the wire"
            )
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
                self._start_tagging()
                self._events.append(Authenticated(self.peer_id, self.peer_name))
            case F.Open() | F.Accept() | F.End() | F.Ack() | F.Complete():
                self._events.append(frame)
            case _:
                raise ProtocolError(f"unexpected {type(frame).__name__}")

    def _on_hello(self, hello: F.Hello) -> None:
        self.peer_id, self.peer_name, self._peer_nonce = hello.peer_id, hello.name, hello.nonce
        self._outbox += F.encode_frame(acceptor_challenge(self._psk, hello, self._nonce))

    def _on_challenge(self, ch: F.Challenge) -> None:
        auth, self._keys = initiator_auth(self._psk, self._nonce, self.peer_id, ch)
        self._outbox += F.encode_frame(auth)

    def _on_auth(self, auth: F.Auth) -> None:
        if not initiator_proof_valid(self._psk, self._nonce, self._peer_nonce, self.peer_id, auth):
            self._outbox += F.encode_frame(F.Abort(0, AbortCode.AUTH, "authentication failed"))
            raise AuthenticationFailed("the initiator does not know our pre-shared key")
        self._outbox += F.encode_frame(F.Ready())
        self._keys = acceptor_macs(self._psk, self._nonce, self._peer_nonce, self.peer_id)
        self._start_tagging()
        self._events.append(Authenticated(self.peer_id, self.peer_name))

    def _start_tagging(self) -> None:
        """From here every frame either way is tagged; the peer earned the full receive scratch."""
        assert self._keys is not None
        self._tx_mac, self._rx_mac = self._keys
        self._compact(_SCRATCH_BYTES)


# ``Role`` and ``ConnState`` belong to ``conn_state``; the engine's sender and receiver import them
# from here with the ``Connection`` they describe.
__all__ = [
    "PRE_AUTH_BUFFER_BYTES",
    "Authenticated",
    "ChunkReceived",
    "ChunkSink",
    "ConnState",
    "Connection",
    "Event",
    "Role",
]
