"""A model's fingerprint, made from its name, block size and model folder: what a tenant's submit
says of the model its decode nodes run, what the pool states for each group (``FrontDoor``
refuses a submit whose field differs from the pool's, naming it: 409 ``fingerprint_mismatch``, and
the tenant prefills locally), and what a node's KV manifests carry and its receiver checks
(``serve.node.host``; the comparison is ``core.fingerprint``'s).

- ``config``: the served model's name (a preset's, for emulated ``timed`` nodes);
- ``block_tokens``: the block both sides hash prefixes and lay KV out by;
- for a model folder (``torch``, ``vllm``): ``dtype`` (its ``config.json``'s), ``cache_layout``
  (a digest of the cache spec ``config.json`` implies: every cached layer's kind, shapes and
  dtype, which is what the receiver installs the KV and recurrent states into) and
  ``weights_digest``.

``weights_digest`` is sampled, not a hash of every byte: SHA-256 over each weights file's name,
size, first and last MiB (a safetensors file's header, naming every tensor with its dtype, shape
and offsets, is in its first bytes). Hashing a 140 GB checkpoint would hold a node's start for
minutes; the sample tells apart different checkpoints and shards of one architecture, but not two
files that differ only in their middle. Reads files: not for the pure layers.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path

from prfaas.core.fingerprint import Fingerprint, as_fingerprint
from prfaas.engine.hf_spec import cache_map_from_config
from prfaas.errors import UsageError

log = logging.getLogger("prfaas.engine")

SAMPLE_BYTES = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def model_fingerprint(
    model: str, block_tokens: int, model_path: str | Path | None = None
) -> dict[str, str]:
    """The fingerprint of ``model`` served with ``block_tokens``; the folder's fields too when
    ``model_path`` is given (a real model)."""
    out = {"config": model, "block_tokens": str(block_tokens)}
    if model_path is not None:
        out.update(folder_fingerprint(str(Path(model_path).resolve())))
    return out


@functools.lru_cache(maxsize=16)
def folder_fingerprint(folder: str) -> dict[str, str]:
    """``dtype``, ``cache_layout`` and ``weights_digest`` of a model folder (read once per
    process: a gateway asks for it on every submit)."""
    path = Path(folder)
    config_path = path / "config.json" if path.is_dir() else path
    cfg = json.loads(config_path.read_text(encoding="utf-8"))
    cmap = cache_map_from_config(cfg)
    layout = hashlib.sha256(repr(cmap.spec).encode()).hexdigest()[:16]
    return {
        "dtype": cmap.dtype.value,
        "cache_layout": layout,
        "weights_digest": _weights_digest(config_path.parent),
    }


def _weights_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    for p in files:
        size = p.stat().st_size
        digest.update(f"{p.name}\0{size}\0".encode())
        with p.open("rb") as f:
            digest.update(f.read(SAMPLE_BYTES))
            if size > SAMPLE_BYTES:
                f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
                digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()[:16] if files else "none"


def engine_fingerprint(
    model: str, block_tokens: int, kind: str, model_path: str | None
) -> Fingerprint:
    """The fingerprint a node or a tenant of this engine serves under: the folder's fields too for
    a real model (torch, vLLM). A folder that cannot be read gives the name and block size only,
    with a warning: the pool then refuses submits naming the missing field (the tenant prefills
    locally), while a receiver compares only what its own fingerprint states."""
    folder = model_path if kind in ("torch", "vllm") else None
    try:
        return as_fingerprint(model_fingerprint(model, block_tokens, folder))
    except (OSError, ValueError, UsageError) as exc:
        log.warning("the model folder %s gives no fingerprint: %s", folder, exc)
        return as_fingerprint(model_fingerprint(model, block_tokens))
