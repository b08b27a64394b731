"""Block hashes of a prompt: the prefix-cache keys the gateway, the KV manager and the nodes share.

Block i's hash chains block i-1's hash with block i's token ids (blake2b, 8 bytes, over the ids as
little-endian int64), so equal hashes at position i mean equal prefixes of (i + 1) blocks. Only
full blocks are hashed. A ``seed`` stands in for block -1's hash: chains of different seeds share
no hash (but by a 2^-63 chance), whatever the tokens (a PrfaaS pool node seeds each tenant's
chain with a salt of its own, ``serve/node/prefix_namespaces.py``); every deployment uses the
empty seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def block_hashes(token_ids: Sequence[int], block_tokens: int, seed: bytes = b"") -> tuple[int, ...]:
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
    data = np.asarray(token_ids, dtype="<i8")
    out: list[int] = []
    prev = seed
    for start in range(0, len(data) - block_tokens + 1, block_tokens):
        h = hashlib.blake2b(prev, digest_size=8)
        h.update(data[start : start + block_tokens].tobytes())
        prev = h.digest()
        out.append(int.from_bytes(prev, "big") >> 1)  # non-negative, fits an int64
    return tuple(out)


def prompt_digest(token_ids: Sequence[int]) -> str:
    """A short hex digest of a whole prompt (token ids as little-endian int64)."""
    data = np.asarray(token_ids, dtype="<i8").tobytes()
    return hashlib.blake2b(data, digest_size=8).hexdigest()
