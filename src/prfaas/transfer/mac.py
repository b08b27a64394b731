"""Per-connection MAC keys from the handshake, and the GMAC tag every later frame carries.

After the HMAC handshake both ends derive two 256-bit keys, one per direction, with HKDF-SHA256
(RFC 5869): extract with both nonces as the salt and the pre-shared key as the input, expand with a
label naming the direction and the initiator's peer id. So a key exists only for one connection,
one direction, and only for holders of the PSK: an attacker who sees the nonces in the clear still
cannot compute it, and a frame copied to another connection or reflected back fails.

Each frame after the handshake carries a 16-byte AES-256-GMAC tag (AES-GCM with nothing to
encrypt: the frame is all associated data) over its header and body (for a CHUNK: header, the 24
meta bytes and the payload). The GCM IV is the frame's sequence number in its direction, counted,
not sent: a replayed, dropped or reordered frame is verified under the wrong number and fails, and
an IV is never reused under a key (GMAC's one requirement). GMAC was measured fastest here
(docs/transfer.md): AES-NI + carry-less multiply, 17-24 GB/s on one core, against 10-12 for
Poly1305 and 2-7 for keyed BLAKE3 fed in 16 KiB-1 MiB pieces.

Pure: no asyncio, no I/O (``cryptography`` runs OpenSSL's code in-process).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from prfaas.transfer.errors import ProtocolError

KEY_BYTES = 32
_IV = struct.Struct("<Q4x")  # 12 bytes: the frame's sequence number, little-endian, then zeros
_MAX_FRAMES = 1 << 64
_LABEL = b"prfaas-kv-v2 mac "

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True, repr=False)
class DirectionKeys:
    """The two MAC keys of one connection (never printed: ``repr`` is off)."""

    initiator_to_acceptor: bytes
    acceptor_to_initiator: bytes


def derive_keys(psk: bytes, nonce_i: bytes, nonce_a: bytes, peer_id: bytes) -> DirectionKeys:
    """HKDF-SHA256: PRK = HMAC(nonce_i | nonce_a, psk); key = HMAC(PRK, label | peer_id | 0x01)."""
    prk = hmac.new(nonce_i + nonce_a, psk, hashlib.sha256).digest()

    def expand(direction: bytes) -> bytes:
        return hmac.new(prk, _LABEL + direction + peer_id + b"\x01", hashlib.sha256).digest()

    return DirectionKeys(expand(b"initiator->acceptor "), expand(b"acceptor->initiator "))


class GmacStream:
    """One frame's tag computed piece by piece, as its bytes go out or land."""

    __slots__ = ("_ctx",)

    def __init__(self, cipher: algorithms.AES, iv: bytes) -> None:
        self._ctx = Cipher(cipher, modes.GCM(iv)).encryptor()

    def update(self, data: Buffer) -> None:
        self._ctx.authenticate_additional_data(data)

    def tag(self) -> bytes:
        self._ctx.finalize()
        return self._ctx.tag


class FrameMac:
    """One direction of one connection: its key and the sequence number of its next frame. Both
    ends keep one per direction and must tag or verify frames in exactly their wire order."""

    __slots__ = ("_aead", "_aes", "next_seq")

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a MAC key is {KEY_BYTES} bytes, got {len(key)}")
        self._aead = AESGCM(key)
        self._aes = algorithms.AES(key)
        self.next_seq = 0

    def _iv(self) -> bytes:
        seq = self.next_seq
        if seq >= _MAX_FRAMES - 1:  # 2^64 frames: unreachable, but an IV must never repeat
            raise ProtocolError("frame counter exhausted: reconnect")
        self.next_seq = seq + 1
        return _IV.pack(seq)

    def tag(self, data: Buffer) -> bytes:
        """The tag of the next frame, given all of its covered bytes at once."""
        return self._aead.encrypt(self._iv(), b"", data)

    def stream(self) -> GmacStream:
        """The tag of the next frame, computed piece by piece (``update`` then ``tag``)."""
        return GmacStream(self._aes, self._iv())


def tags_equal(a: bytes, b: bytes | memoryview) -> bool:
    return hmac.compare_digest(a, bytes(b))
