"""Checksums and the session digest, and the byte-range bookkeeping both ends keep per session.

A chunk's checksum is xxh3_64 over its 24 meta bytes (session, layer, offset, length) then its
payload, so a corrupted header cannot put correct bytes in the wrong place unnoticed. The session
digest is xxh3_64 over every chunk's (layer, offset, length, checksum), sorted by (layer, offset):
chunks may arrive in any order over any connection, and the digest still proves that exactly the
chunks the sender produced (and no others) were verified. ``Ranges`` rejects overlaps (so a
duplicated chunk can never overwrite verified bytes) and tells when a layer is covered.
Pure: no asyncio, no I/O.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable

import xxhash

from prfaas.transfer import frames as F

_RECORD = struct.Struct("<IQIQ")


def chunk_checksum(chunk_meta: bytes, payload: memoryview | bytes) -> int:
    h = xxhash.xxh3_64(chunk_meta)
    h.update(payload)
    return h.intdigest()


def make_chunk(session_id: int, layer: int, offset: int, payload: memoryview | bytes) -> F.Chunk:
    """The CHUNK frame (with its checksum) for ``payload`` at ``offset`` of ``layer``."""
    length = len(payload)
    meta = F.CHUNK_META.pack(session_id, layer, offset, length)
    return F.Chunk(session_id, layer, offset, length, chunk_checksum(meta, payload))


def verify_chunk(chunk: F.Chunk, payload: memoryview) -> bool:
    return chunk_checksum(F.chunk_meta(chunk), payload) == chunk.checksum


def session_digest(records: Iterable[tuple[int, int, int, int]]) -> int:
    """Digest of (layer, offset, length, checksum) records, independent of their arrival order."""
    h = xxhash.xxh3_64()
    for rec in sorted(records):
        h.update(_RECORD.pack(*rec))
    return h.intdigest()


class Ranges:
    """Disjoint byte ranges claimed within each layer of a session."""

    __slots__ = ("_covered", "_ends", "_layer_bytes", "_starts")

    def __init__(self, layer_bytes: tuple[int, ...]) -> None:
        self._layer_bytes = layer_bytes
        self._starts: list[list[int]] = [[] for _ in layer_bytes]
        self._ends: list[list[int]] = [[] for _ in layer_bytes]
        self._covered = [0] * len(layer_bytes)

    def check(self, layer: int, offset: int, length: int) -> str | None:
        """Why ``[offset, offset+length)`` of ``layer`` cannot be claimed, or None if it can."""
        if not 0 <= layer < len(self._layer_bytes):
            return f"layer {layer} not in the manifest ({len(self._layer_bytes)} layers)"
        size = self._layer_bytes[layer]
        if length <= 0 or offset < 0 or offset + length > size:
            return f"bytes [{offset}, {offset + length}) outside layer {layer} of {size} bytes"
        starts, ends = self._starts[layer], self._ends[layer]
        i = bisect.bisect_right(starts, offset)
        if i > 0 and ends[i - 1] > offset:
            return f"bytes [{offset}, {offset + length}) of layer {layer} overlap earlier ones"
        if i < len(starts) and starts[i] < offset + length:
            return f"bytes [{offset}, {offset + length}) of layer {layer} overlap earlier ones"
        return None

    def claim(self, layer: int, offset: int, length: int) -> None:
        """Record the range (call ``check`` first); raises ValueError if it cannot be claimed."""
        why = self.check(layer, offset, length)
        if why is not None:
            raise ValueError(why)
        i = bisect.bisect_right(self._starts[layer], offset)
        self._starts[layer].insert(i, offset)
        self._ends[layer].insert(i, offset + length)
        self._covered[layer] += length

    def covered(self, layer: int) -> int:
        return self._covered[layer]

    def layer_full(self, layer: int) -> bool:
        return self._covered[layer] == self._layer_bytes[layer]

    def missing(self) -> list[tuple[int, int]]:
        """(layer, bytes missing) for every layer not fully covered."""
        return [
            (i, size - self._covered[i])
            for i, size in enumerate(self._layer_bytes)
            if self._covered[i] != size
        ]
