"""The session digest and the byte-range bookkeeping both ends keep per session.

A chunk's bytes are proven by its MAC (``mac``, checked by the codec as they land). What is left
to check at the end is the chunking itself: the session digest is xxh3_64 over every chunk's
(layer, offset, length), sorted by (layer, offset), so chunks may arrive in any order over any
connection and the receiver still confirms that it verified exactly the chunks the sender made
(the END frame that carries it is MAC-tagged, so the digest needs no key). ``Ranges`` rejects
overlaps (so a duplicated chunk can never overwrite verified bytes) and tells when a layer is
covered. Pure: no asyncio, no I/O.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable

import xxhash

_RECORD = struct.Struct("<IQI")


def session_digest(records: Iterable[tuple[int, int, int]]) -> int:
    """Digest of (layer, offset, length) records, independent of their arrival order."""
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
