"""The frames of the wire format: their types, fields, limits, and body (de)serialisation.

Every frame is an 8-byte header (magic ``b"PK"``, version, type, body length, little-endian)
followed by its body; see docs/wire-format.md. This module encodes and decodes *bodies* and owns
every length limit; ``codec`` does framing, the connection state machine and the MAC tag that every
frame after the handshake carries (at the end of a control body; in a CHUNK's meta, before the
payload). A CHUNK's payload is not part of its ``Chunk`` value: the codec writes it straight into
the receiver's buffer.
Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from prfaas.spec import DType, LayerKind
from prfaas.transfer.errors import AbortCode, FrameTooLarge, ProtocolError
from prfaas.transfer.manifest import (
    MAX_FINGERPRINT_FIELDS,
    MAX_FINGERPRINT_NAME_BYTES,
    MAX_FINGERPRINT_VALUE_BYTES,
    MAX_LAYERS,
    MAX_REQUEST_ID_BYTES,
    MAX_TENSOR_DIMS,
    MAX_TENSOR_NAME_BYTES,
    MAX_TENSORS_PER_LAYER,
    LayerEntry,
    Manifest,
    TensorEntry,
)

Buffer = bytes | bytearray | memoryview

MAGIC = b"PK"
VERSION = 3
"""3: a manifest ends with the sender's model fingerprint (2 had none)."""
HEADER = struct.Struct("<2sBBI")
HEADER_BYTES = HEADER.size  # 8
NONCE_BYTES = 16
PROOF_BYTES = 32  # HMAC-SHA256
TAG_BYTES = 16  # AES-GMAC, on every frame after the handshake (``mac``)
PEER_ID_BYTES = 16
MAX_NAME_BYTES = 64
MAX_REASON_BYTES = 512
MAX_CONTROL_BODY_BYTES = 1 << 20
"""No control frame (everything but CHUNK) may be longer; only OPEN (a manifest) comes near it,
and only after authentication. Every other type has its own, far smaller bound below."""
MAX_CHUNK_BYTES = 64 << 20
"""No chunk payload may be longer: bounds any single write into a receiver's buffer."""


class FrameType(enum.IntEnum):
    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    READY = 4
    OPEN = 5
    ACCEPT = 6
    CHUNK = 7
    END = 8
    ACK = 9
    COMPLETE = 10
    ABORT = 11


@dataclass(frozen=True, slots=True)
class Hello:
    """Initiator -> acceptor, first frame: who I am and my challenge nonce."""

    peer_id: bytes
    nonce: bytes
    name: str = ""


@dataclass(frozen=True, slots=True)
class Challenge:
    """Acceptor -> initiator: its nonce and its proof that it knows the key."""

    nonce: bytes
    proof: bytes


@dataclass(frozen=True, slots=True)
class Auth:
    """Initiator -> acceptor: the initiator's proof."""

    proof: bytes


@dataclass(frozen=True, slots=True)
class Ready:
    """Acceptor -> initiator: authenticated; sessions may start."""


@dataclass(frozen=True, slots=True)
class Open:
    session_id: int
    manifest: Manifest


@dataclass(frozen=True, slots=True)
class Accept:
    session_id: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """A byte range of one layer. ``layer`` is the position in the manifest; the payload (``length``
    bytes) follows on the wire. ``tag`` is the frame's MAC (header, 24 meta bytes, payload), set by
    the sending codec and read by the receiving one; empty in a chunk about to be sent."""

    session_id: int
    layer: int
    offset: int
    length: int
    tag: bytes = b""


@dataclass(frozen=True, slots=True)
class End:
    """Sender -> receiver: every chunk of the session has been sent."""

    session_id: int
    num_chunks: int
    digest: int
    first_token: int = -1


@dataclass(frozen=True, slots=True)
class Ack:
    """Receiver -> sender: cumulative bytes of the session received and MAC-verified."""

    session_id: int
    num_bytes: int


@dataclass(frozen=True, slots=True)
class Complete:
    """Receiver -> sender: the session is verified and handed to the consumer."""

    session_id: int


@dataclass(frozen=True, slots=True)
class Abort:
    """Either way. ``session_id`` 0 aborts the whole connection."""

    session_id: int
    code: AbortCode
    reason: str


Frame = Hello | Challenge | Auth | Ready | Open | Accept | Chunk | End | Ack | Complete | Abort

FRAME_TYPE: dict[type, FrameType] = {
    Hello: FrameType.HELLO,
    Challenge: FrameType.CHALLENGE,
    Auth: FrameType.AUTH,
    Ready: FrameType.READY,
    Open: FrameType.OPEN,
    Accept: FrameType.ACCEPT,
    Chunk: FrameType.CHUNK,
    End: FrameType.END,
    Ack: FrameType.ACK,
    Complete: FrameType.COMPLETE,
    Abort: FrameType.ABORT,
}

CHUNK_META = struct.Struct("<QIQI")  # session_id, layer, offset, length: 24 bytes, MAC-covered
CHUNK_META_BYTES = CHUNK_META.size + TAG_BYTES  # + the tag: 40

_HELLO_MAX_BODY_BYTES = PEER_ID_BYTES + NONCE_BYTES + 2 + MAX_NAME_BYTES
MAX_BODY_BYTES: dict[FrameType, int] = {
    FrameType.HELLO: _HELLO_MAX_BODY_BYTES,  # 98
    FrameType.CHALLENGE: NONCE_BYTES + PROOF_BYTES,
    FrameType.AUTH: PROOF_BYTES,
    FrameType.READY: 0,
    FrameType.OPEN: MAX_CONTROL_BODY_BYTES,
    FrameType.ACCEPT: 8 + TAG_BYTES,
    FrameType.END: 28 + TAG_BYTES,
    FrameType.ACK: 16 + TAG_BYTES,
    FrameType.COMPLETE: 8 + TAG_BYTES,
    FrameType.ABORT: 12 + MAX_REASON_BYTES + TAG_BYTES,
}
"""The largest body each control type may declare (tag included), checked at the header before a
byte of the body is buffered: before authentication nothing larger than ``PRE_AUTH_FRAME_BYTES``
is ever held for a peer."""
_PRE_AUTH_TYPES = (FrameType.HELLO, FrameType.CHALLENGE, FrameType.AUTH, FrameType.READY)
PRE_AUTH_FRAME_BYTES = HEADER_BYTES + max(
    MAX_BODY_BYTES[t] for t in (*_PRE_AUTH_TYPES, FrameType.ABORT)
)  # 548: an ABORT with the longest reason
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")
_SID_U64 = struct.Struct("<QQ")
_END = struct.Struct("<QIQq")
_ABORT = struct.Struct("<QH")
_MANIFEST_HEAD = struct.Struct("<IIH")
_LAYER_HEAD = struct.Struct("<IBIIB")
_TENSOR_HEAD = struct.Struct("<BB")
_KIND_CODE = {LayerKind.GQA: 1, LayerKind.MLA: 2, LayerKind.SWA: 3, LayerKind.LINEAR: 4}
_DTYPE_CODE = {DType.BF16: 1, DType.FP16: 2, DType.FP32: 3, DType.FP8: 4}
_KIND_OF = {v: k for k, v in _KIND_CODE.items()}
_DTYPE_OF = {v: k for k, v in _DTYPE_CODE.items()}


def header(frame_type: FrameType, body_len: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, frame_type, body_len)


def chunk_meta(chunk: Chunk) -> bytes:
    """The 24 bytes the MAC covers between the header and the payload."""
    return CHUNK_META.pack(chunk.session_id, chunk.layer, chunk.offset, chunk.length)


# -- encoding ---------------------------------------------------------------------------------
def _str(value: str, limit: int, what: str, width: struct.Struct = _U16) -> bytes:
    raw = value.encode()
    if len(raw) > limit:
        raise ValueError(f"{what} is {len(raw)} bytes, the limit is {limit}")
    return width.pack(len(raw)) + raw


def _fixed(value: bytes, size: int, what: str) -> bytes:
    if len(value) != size:
        raise ValueError(f"{what} must be {size} bytes, got {len(value)}")
    return value


def encode_body(frame: Frame) -> bytes:
    """The body of ``frame`` (for a CHUNK: its 32 meta bytes, without the payload)."""
    match frame:
        case Hello(peer_id, nonce, name):
            return (
                _fixed(peer_id, PEER_ID_BYTES, "peer_id")
                + _fixed(nonce, NONCE_BYTES, "nonce")
                + _str(name, MAX_NAME_BYTES, "name")
            )
        case Challenge(nonce, proof):
            return _fixed(nonce, NONCE_BYTES, "nonce") + _fixed(proof, PROOF_BYTES, "proof")
        case Auth(proof):
            return _fixed(proof, PROOF_BYTES, "proof")
        case Ready():
            return b""
        case Open(session_id, manifest):
            return _U64.pack(session_id) + _encode_manifest(manifest)
        case Accept(session_id) | Complete(session_id):
            return _U64.pack(session_id)
        case Chunk():
            return chunk_meta(frame) + _fixed(frame.tag, TAG_BYTES, "tag")
        case End(session_id, num_chunks, digest, first_token):
            return _END.pack(session_id, num_chunks, digest, first_token)
        case Ack(session_id, num_bytes):
            return _SID_U64.pack(session_id, num_bytes)
        case Abort(session_id, code, reason):
            raw = reason.encode()[:MAX_REASON_BYTES].decode(errors="ignore")
            return _ABORT.pack(session_id, int(code)) + _str(raw, MAX_REASON_BYTES, "reason")
    raise TypeError(f"not a frame: {frame!r}")


def encode_frame(frame: Frame) -> bytes:
    """Header + body, untagged: the handshake frames (after it, ``codec.Connection.send`` tags
    every frame). For a CHUNK the caller sends the payload right after these bytes."""
    body = encode_body(frame)
    body_len = len(body) + (frame.length if isinstance(frame, Chunk) else 0)
    return header(FRAME_TYPE[type(frame)], body_len) + body


def _encode_manifest(m: Manifest) -> bytes:
    parts = [_str(m.request_id, MAX_REQUEST_ID_BYTES, "request_id")]
    parts.append(_MANIFEST_HEAD.pack(m.num_tokens, m.num_cached_tokens, len(m.layers)))
    for layer in m.layers:
        parts.append(
            _LAYER_HEAD.pack(
                layer.layer_index,
                _KIND_CODE[layer.kind],
                layer.first_token,
                layer.num_token_rows,
                len(layer.tensors),
            )
        )
        for t in layer.tensors:
            parts.append(_str(t.name, MAX_TENSOR_NAME_BYTES, "tensor name", _U8))
            parts.append(_TENSOR_HEAD.pack(_DTYPE_CODE[t.dtype], len(t.shape)))
            parts.append(struct.pack(f"<{len(t.shape)}I", *t.shape))
    parts.append(_U8.pack(len(m.fingerprint)))
    for name, value in m.fingerprint:
        parts.append(_str(name, MAX_FINGERPRINT_NAME_BYTES, "fingerprint field", _U8))
        parts.append(_str(value, MAX_FINGERPRINT_VALUE_BYTES, "fingerprint value", _U8))
    body = b"".join(parts)
    if len(body) + 8 + TAG_BYTES > MAX_CONTROL_BODY_BYTES:
        raise ValueError(f"manifest encodes to {len(body)} bytes, over {MAX_CONTROL_BODY_BYTES}")
    return body


# -- decoding ---------------------------------------------------------------------------------
class _Reader:
    """A cursor over one frame body; every read checks bounds and raises ProtocolError."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise ProtocolError(f"frame body truncated: needs {n} bytes at offset {self.pos}")
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def unpack(self, s: struct.Struct) -> tuple[int, ...]:
        return s.unpack(self.take(s.size))  # type: ignore[no-any-return]

    def string(self, limit: int, what: str, width: struct.Struct = _U16) -> str:
        (n,) = self.unpack(width)
        if n > limit:
            raise FrameTooLarge(f"{what} is {n} bytes, the limit is {limit}")
        try:
            return self.take(n).decode()
        except UnicodeDecodeError:
            raise ProtocolError(f"{what} is not valid UTF-8") from None

    def done(self, what: str) -> None:
        if self.pos != len(self.buf):
            raise ProtocolError(f"{what} frame has {len(self.buf) - self.pos} trailing bytes")


def decode_body(frame_type: FrameType, body: memoryview) -> Frame:
    """Decode a control frame's body (not CHUNK: the codec handles those). ProtocolError if bad."""
    r = _Reader(body)
    frame: Frame
    match frame_type:
        case FrameType.HELLO:
            frame = Hello(
                r.take(PEER_ID_BYTES), r.take(NONCE_BYTES), r.string(MAX_NAME_BYTES, "name")
            )
        case FrameType.CHALLENGE:
            frame = Challenge(r.take(NONCE_BYTES), r.take(PROOF_BYTES))
        case FrameType.AUTH:
            frame = Auth(r.take(PROOF_BYTES))
        case FrameType.READY:
            frame = Ready()
        case FrameType.OPEN:
            (sid,) = r.unpack(_U64)
            frame = Open(sid, _decode_manifest(r))
        case FrameType.ACCEPT:
            frame = Accept(*r.unpack(_U64))
        case FrameType.END:
            frame = End(*r.unpack(_END))
        case FrameType.ACK:
            frame = Ack(*r.unpack(_SID_U64))
        case FrameType.COMPLETE:
            frame = Complete(*r.unpack(_U64))
        case FrameType.ABORT:
            sid, code = r.unpack(_ABORT)
            try:
                abort_code = AbortCode(code)
            except ValueError:
                abort_code = AbortCode.INTERNAL  # a newer peer's code: still an abort
            frame = Abort(sid, abort_code, r.string(MAX_REASON_BYTES, "reason"))
        case _:
            raise ProtocolError(f"frame type {frame_type!r} has no control body")
    r.done(frame_type.name)
    return frame


def _decode_manifest(r: _Reader) -> Manifest:
    request_id = r.string(MAX_REQUEST_ID_BYTES, "request_id")
    num_tokens, num_cached, num_layers = r.unpack(_MANIFEST_HEAD)
    if not 0 < num_layers <= MAX_LAYERS:
        raise FrameTooLarge(f"manifest has {num_layers} layers, allowed 1..{MAX_LAYERS}")
    layers = []
    for _ in range(num_layers):
        index, kind_code, first, rows, num_tensors = r.unpack(_LAYER_HEAD)
        kind = _KIND_OF.get(kind_code)
        if kind is None:
            raise ProtocolError(f"unknown layer kind code {kind_code}")
        if num_tensors > MAX_TENSORS_PER_LAYER:
            raise FrameTooLarge(f"layer has {num_tensors} tensors, max {MAX_TENSORS_PER_LAYER}")
        tensors = []
        for _ in range(num_tensors):
            name = r.string(MAX_TENSOR_NAME_BYTES, "tensor name", _U8)
            dtype_code, ndim = r.unpack(_TENSOR_HEAD)
            dtype = _DTYPE_OF.get(dtype_code)
            if dtype is None:
                raise ProtocolError(f"unknown dtype code {dtype_code}")
            if ndim > MAX_TENSOR_DIMS:
                raise FrameTooLarge(f"tensor {name!r} has {ndim} dims, max {MAX_TENSOR_DIMS}")
            shape = struct.unpack(f"<{ndim}I", r.take(4 * ndim))
            tensors.append(TensorEntry(name, dtype, shape))
        layers.append(LayerEntry(index, kind, first, rows, tuple(tensors)))
    (num_fields,) = r.unpack(_U8)
    if num_fields > MAX_FINGERPRINT_FIELDS:
        raise FrameTooLarge(f"fingerprint has {num_fields} fields, max {MAX_FINGERPRINT_FIELDS}")
    fingerprint = tuple(
        (
            r.string(MAX_FINGERPRINT_NAME_BYTES, "fingerprint field", _U8),
            r.string(MAX_FINGERPRINT_VALUE_BYTES, "fingerprint value", _U8),
        )
        for _ in range(num_fields)
    )
    try:
        return Manifest(request_id, num_tokens, num_cached, tuple(layers), fingerprint)
    except ValueError as exc:  # the manifest's own validation names the bad value
        raise ProtocolError(f"invalid manifest: {exc}") from None


def decode_chunk_meta(meta: bytes | memoryview) -> Chunk:
    sid, layer, offset, length = CHUNK_META.unpack_from(meta)
    tag = bytes(meta[CHUNK_META.size : CHUNK_META_BYTES])
    return Chunk(sid, layer, offset, length, tag)
