"""``BatchWorkspace``: the buffers a decode step on the CPU gathers its running requests'
attention caches into, kept from one step to the next instead of allocated afresh.

Why: a step's batch cache is ``batch x heads x padded context x dim`` per attention tensor (tens
of MB from batch 32 at 4,096 tokens). Gathered into fresh tensors, and concatenated with the new
token into fresh ones again by the forward pass (``DynamicLayer.update``), those blocks came from
glibc's ``mmap`` or a heap top it trimmed, so every step page-faulted the whole batch in again:
measured on this machine (docs/engine.md), batch 64 x 6,000 tokens took 127-156 ms a step, 46 ms
with this workspace and the in-place writes of ``hf_cache.build_cache`` / ``append_step``.

A buffer holds the gathered rows plus one column for the step's own token, which the forward
pass writes in place; each request then copies its new row into its own cache
(``RequestCache.room``), so nothing a request keeps points into these buffers and the next step
may overwrite them. On a GPU the caching allocator already reuses blocks and a kept buffer would
only hold device memory: the engine keeps a workspace on the CPU only.

Owns the buffers and their sizes; never imports transformers or the engine. Used by one thread
(the engine's) at a time.
"""

from __future__ import annotations

import math

import torch

GROWTH = 1.25
"""A buffer that must grow takes this much more than asked, so a batch whose context grows by a
token a step does not reallocate every step."""


class BatchWorkspace:
    def __init__(self) -> None:
        self._buffers: dict[tuple[int, str], torch.Tensor] = {}

    def tensor(
        self, key: tuple[int, str], shape: tuple[int, ...], like: torch.Tensor
    ) -> torch.Tensor:
        """A contiguous tensor of ``shape`` over the buffer kept for ``key`` (a spec position and
        tensor name), of ``like``'s dtype and device; its contents are whatever was there."""
        numel = math.prod(shape)
        buf = self._buffers.get(key)
        fits = buf is not None and buf.numel() >= numel
        if not fits or buf is None or (buf.dtype, buf.device) != (like.dtype, like.device):
            buf = like.new_empty(int(numel * GROWTH) + 1)
            self._buffers[key] = buf
        return buf[:numel].view(shape)

    def clear(self) -> None:
        """Give the buffers back (the engine does when nothing runs)."""
        self._buffers.clear()
