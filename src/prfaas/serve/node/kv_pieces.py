"""Which bytes of one prefill layer's KV cross to the receiver (``pieces_for_receiver``).

A prefill node hands out each layer (``engine.LayerOutput``) as the engine computes it; the
receiver's segment (``spec.LayerSegment`` of the manifest's layout) may start before or after
where this node's computation did: the receiver may hold less of the prompt's prefix than this
node reused from its store (then the stored rows go first) or more (then the computed rows it
holds are dropped). The pieces are ``(offset, view)`` in the receiver's segment, views of the
engine's and the store's buffers (no copy) wherever the sizes allow.

Pure: no I/O, no asyncio, no clock. Must not import the node (``serve.node.worker``), which
calls it once per layer, nor anything of ``transfer``: the caller sends the pieces.
"""

from __future__ import annotations

from prfaas.engine import CachedPrefix, LayerOutput
from prfaas.spec import LayerSegment


def pieces_for_receiver(
    out: LayerOutput,
    cached: CachedPrefix | None,
    target: LayerSegment,
    receiver_tokens: int,
) -> list[tuple[int, memoryview]]:
    """``(offset, view)`` pieces of one layer as the receiver needs it: full-attention rows from
    ``receiver_tokens`` on (it holds the rows before), taken from this node's stored prefix and the
    new rows (no copy); SWA windows and linear states are whole already. Scaled (timed) payloads,
    whose per-tensor rounding does not split by rows, are padded or cut to the manifest's sizes."""
    computed_from = 0 if cached is None else cached.num_tokens
    if not out.segment.kind.grows_with_length or computed_from == receiver_tokens:
        return list(out.pieces())
    if out.rows is not None:
        return _row_pieces(out, cached, target, receiver_tokens)
    pieces: list[tuple[int, memoryview]] = []
    offset = 0
    new_rows = out.segment.num_token_rows
    for i, tensor in enumerate(target.tensors):
        tail = out.buffers[i]
        row = tail.nbytes // new_rows if new_rows else 0
        if receiver_tokens > computed_from:  # the receiver holds some of what was computed here
            parts = [tail[(receiver_tokens - computed_from) * row :]]
        else:  # send stored prefix rows [receiver_tokens, computed_from) first
            assert cached is not None
            head = cached.layers[out.position].buffers[i]
            parts = [head[receiver_tokens * row :], tail]
        if row * new_rows == tail.nbytes and sum(p.nbytes for p in parts) == tensor.num_bytes:
            for part in parts:
                pieces.append((offset, part))
                offset += part.nbytes
            continue
        data = b"".join(bytes(p) for p in parts)[: tensor.num_bytes]
        pieces.append((offset, memoryview(data.ljust(tensor.num_bytes, b"\0"))))
        offset += tensor.num_bytes
    return pieces


def _row_pieces(
    out: LayerOutput,
    cached: CachedPrefix | None,
    target: LayerSegment,
    receiver_tokens: int,
) -> list[tuple[int, memoryview]]:
    """One prefill pass's KV rows ``out.rows`` of a layer, placed in the receiver's segment: rows
    the receiver holds are dropped, and the first pass's part also carries this node's stored
    prefix rows ``[receiver_tokens, computed_from)`` the receiver lacks (no copy)."""
    assert out.rows is not None
    start, end = out.rows
    computed_from = out.segment.first_token
    pieces: list[tuple[int, memoryview]] = []
    base = 0
    for i, tensor in enumerate(target.tensors):
        row = out.buffers[i].nbytes // (end - start)
        if start == computed_from and receiver_tokens < computed_from:
            assert cached is not None
            head = cached.layers[out.position].buffers[i]
            pieces.append((base, head[receiver_tokens * row : computed_from * row]))
        lo = max(start, receiver_tokens)
        if lo < end:
            tail = out.buffers[i][(lo - start) * row :]
            pieces.append((base + (lo - receiver_tokens) * row, tail))
        base += tensor.num_bytes
    return pieces
