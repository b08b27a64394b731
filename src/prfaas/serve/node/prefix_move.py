"""Cross-site prefix-cache moves (the ``prfaas`` router's ``CacheMove``), carried out live.

The destination pulls: the gateway asks a node of the destination site to fetch ``num_tokens`` of a
prompt's prefix; that process asks a node of the source site to push the stored checkpoint over the
transfer engine (paced like any inter-site KV) under a ``prefix:`` session id, inserts what arrives
into its own ``PrefixStore`` and only then answers the gateway, so the prefill that follows finds
it. A failed move costs nothing but the hit: the prefill computes what it cannot reuse.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from prfaas.engine import CachedPrefix, LayerOutput
from prfaas.serve.node.prefix_store import PrefixStore
from prfaas.spec import CacheLayout
from prfaas.transfer import Delivery, Manifest

PREFIX_SESSION = "prefix:"
_ids = itertools.count()


def new_move_id(process: str) -> str:
    return f"{PREFIX_SESSION}{process}:{next(_ids)}"


def is_move(request_id: str) -> bool:
    return request_id.startswith(PREFIX_SESSION)


def prefix_from_delivery(delivery: Delivery, layout: CacheLayout) -> CachedPrefix:
    """Rebuild a ``CachedPrefix`` from the received per-layer buffers (tensors back to back)."""
    layers = []
    for position, (segment, buffer) in enumerate(
        zip(layout.segments, delivery.buffers, strict=True)
    ):
        views, offset = [], 0
        for tensor in segment.tensors:
            views.append(buffer[offset : offset + tensor.num_bytes])
            offset += tensor.num_bytes
        layers.append(LayerOutput(delivery.request_id, position, segment, tuple(views)))
    return CachedPrefix(layout.num_tokens, tuple(layers))


class PendingMoves:
    """Moves this process is waiting to receive: move id -> (hashes, layout, future)."""

    def __init__(self, store: PrefixStore) -> None:
        self.store = store
        self._waiting: dict[str, tuple[Sequence[int], CacheLayout, asyncio.Future[int]]] = {}

    def expect(
        self, move_id: str, block_hashes: Sequence[int], layout: CacheLayout
    ) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting[move_id] = (block_hashes, layout, future)
        return future

    def forget(self, move_id: str) -> None:
        self._waiting.pop(move_id, None)

    def allocate(self, manifest: Manifest) -> list[bytearray] | None:
        entry = self._waiting.get(manifest.request_id)
        if entry is None:
            return None
        return [bytearray(layer.num_bytes) for layer in manifest.layers]

    def delivered(self, delivery: Delivery) -> None:
        entry = self._waiting.pop(delivery.request_id, None)
        if entry is None:
            return
        hashes, layout, future = entry
        prefix = prefix_from_delivery(delivery, layout)
        self.store.insert(hashes, [prefix])
        if not future.done():
            future.set_result(prefix.num_tokens)

    def failed(self, move_id: str, error: Exception) -> None:
        entry = self._waiting.pop(move_id, None)
        if entry is not None and not entry[2].done():
            entry[2].set_exception(error)
