"""vLLM's KV cache events as they come off its ZMQ publisher (``--kv-events-config``), decoded
into frozen dataclasses: the wire format only, no sockets and no state.

A publisher message is three frames: topic, an 8-byte big-endian sequence number (per publisher
lifetime, from 0), and a msgpack payload (vLLM encodes it with msgspec): a batch ``[ts, events,
data_parallel_rank]``, each event a map tagged by ``"type"``: ``BlockStored`` (``block_hashes``,
``parent_block_hash``, ``token_ids`` of those blocks end to end, ``block_size``, ``lora_id``,
``medium``, ``lora_name``, optional ``extra_keys``, ``group_idx``, ...), ``BlockRemoved``
(``block_hashes``, ``medium``, ``group_idx``) and ``AllBlocksCleared``. Block hashes are bytes
(sha256) or 64-bit ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``). The replay socket (a ROUTER)
answers an 8-byte start sequence number with the buffered messages from there, then an empty
topic, ``END_SEQ`` and an empty payload.

A payload that is not such a batch raises ``EventDecodeError`` (the caller treats it as lost
events); an event of a type this module does not know is skipped (a later vLLM may add some).
Must not import vllm or zmq.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import msgpack

BlockKey: TypeAlias = bytes | int
"""A vLLM block hash (``ExternalBlockHash``)."""

SEQ_BYTES = 8
END_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)
"""The replay socket's end-of-replay marker in the sequence frame."""
PRIMARY_MEDIUM = "GPU"
"""vLLM's own block pool names its medium so even on CPU; other media are offload tiers."""
MAX_PAYLOAD_BYTES = 64 << 20
"""A batch larger than this is refused undecoded (junk must not cost the sidecar its memory)."""


class EventDecodeError(ValueError):
    """A message that is not a well-formed KV event batch."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[BlockKey, ...]
    parent: BlockKey | None
    """The block before the first of these (None: they start the prompt)."""
    token_ids: tuple[int, ...]
    """The tokens of all these blocks, end to end (``block_size`` each)."""
    block_size: int
    group: int
    """vLLM's KV cache group (``group_idx``; 0 when absent)."""
    plain: bool
    """Keyed by token ids alone, in vLLM's own pool: no LoRA, no extra keys (multimodal
    features, ``cache_salt``), primary medium, local, one ``block_size`` of tokens per hash.
    prfaas prompts hit only such blocks."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockKey, ...]
    group: int
    primary: bool
    """Removed from vLLM's own pool (not from an offload tier)."""


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


def parse_seq(frame: bytes) -> int:
    """A message's sequence number; ``EventDecodeError`` for a frame that is not 8 bytes."""
    if len(frame) != SEQ_BYTES:
        raise EventDecodeError(f"sequence frame of {len(frame)} bytes, not {SEQ_BYTES}")
    return int.from_bytes(frame, "big")


def decode_batch(payload: bytes) -> tuple[KvEvent, ...]:
    """The events of one published batch, in order."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise EventDecodeError(f"a {len(payload)}-byte batch (over {MAX_PAYLOAD_BYTES})")
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several kinds for bad input
        raise EventDecodeError(f"not msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise EventDecodeError(f"not an event batch: {_short(batch)}")
    out: list[KvEvent] = []
    for raw in batch[1]:
        event = _event(raw)
        if event is not None:
            out.append(event)
    return tuple(out)


def _event(raw: Any) -> KvEvent | None:
    if not isinstance(raw, dict):
        raise EventDecodeError(f"an event that is not a map: {_short(raw)}")
    kind = raw.get("type")
    if kind == "BlockStored":
        return _stored(raw)
    if kind == "BlockRemoved":
        hashes = _hashes(raw.get("block_hashes"))
        medium = raw.get("medium")
        return BlockRemoved(hashes, _group(raw), medium in (None, PRIMARY_MEDIUM))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None  # a kind this sidecar does not know: nothing it could do with it


def _stored(raw: dict[Any, Any]) -> BlockStored:
    hashes = _hashes(raw.get("block_hashes"))
    parent = raw.get("parent_block_hash")
    if parent is not None and not _is_key(parent):
        raise EventDecodeError(f"parent_block_hash {_short(parent)}")
    tokens = raw.get("token_ids")
    size = raw.get("block_size")
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise EventDecodeError(f"token_ids {_short(tokens)}")
    if type(size) is not int or size <= 0:
        raise EventDecodeError(f"block_size {_short(size)}")
    extra = raw.get("extra_keys")
    if extra is not None and not isinstance(extra, list):
        raise EventDecodeError(f"extra_keys {_short(extra)}")
    plain = (
        # Masked-out or null blocks (sliding windows) leave the tokens out of line with the
        # hashes: nothing of such an event can be placed.
        len(tokens) == len(hashes) * size
        and raw.get("lora_id") is None
        and raw.get("lora_name") is None
        and (extra is None or all(e is None for e in extra))
        and raw.get("medium") in (None, PRIMARY_MEDIUM)
        and raw.get("locality") in (None, "LOCAL")
    )
    return BlockStored(hashes, parent, tuple(tokens), size, _group(raw), plain)


def _is_key(value: Any) -> bool:
    return isinstance(value, bytes) or type(value) is int


def _hashes(value: Any) -> tuple[BlockKey, ...]:
    if not isinstance(value, list) or not value or not all(_is_key(h) for h in value):
        raise EventDecodeError(f"block_hashes {_short(value)}")
    return tuple(value)


def _group(raw: dict[Any, Any]) -> int:
    group = raw.get("group_idx")
    if group is None:
        return 0
    if type(group) is not int or group < 0:
        raise EventDecodeError(f"group_idx {_short(group)}")
    return group


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
