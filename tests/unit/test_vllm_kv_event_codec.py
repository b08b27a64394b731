"""vLLM's KV cache event batches decoded: a batch vLLM 0.32's own classes and msgspec encoder
wrote (``tests/unit/data/vllm-0.32-kv-events.msgpack``: two stores, a removal, a salted store,
a clear), and junk of every shape refused with ``EventDecodeError`` or skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from prfaas.serve.vllm.kv_event_codec import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    decode_batch,
    parse_seq,
)

REAL = (Path(__file__).parent / "data" / "vllm-0.32-kv-events.msgpack").read_bytes()


def _stored(**over: Any) -> dict[str, Any]:
    event = {
        "type": "BlockStored", "block_hashes": [b"a" * 32], "parent_block_hash": None,
        "token_ids": [1, 2], "block_size": 2, "lora_id": None, "medium": "GPU",
        "lora_name": None, "group_idx": 0,
    }  # fmt: skip
    event.update(over)
    return event


def _batch(*events: Any) -> bytes:
    return bytes(msgpack.packb([1.0, list(events), 0]))


def test_vllms_own_encoding_decodes() -> None:
    h = [bytes([i]) * 32 for i in range(1, 5)]
    assert decode_batch(REAL) == (
        BlockStored((h[0], h[1]), None, tuple(range(100, 108)), 4, 0, True),
        BlockStored((h[2],), h[1], (7, 8, 9, 10), 4, 0, True),
        BlockRemoved((h[1],), 0, True),
        BlockStored((h[3],), None, (1, 2, 3, 4), 4, 0, False),  # extra keys (a cache salt)
        AllBlocksCleared(),
    )


def test_int_hashes_groups_and_tiers() -> None:
    events = decode_batch(
        _batch(
            _stored(block_hashes=[7], parent_block_hash=3, group_idx=None),
            _stored(medium="CPU"),
            _stored(lora_name="adapter"),
            _stored(token_ids=[1, 2, 3]),  # not one block_size a hash (masked blocks)
            _stored(group_idx=1),
            {"type": "BlockRemoved", "block_hashes": [7], "medium": "CPU"},
        )
    )
    assert events[0] == BlockStored((7,), 3, (1, 2), 2, 0, True)
    assert [e.plain for e in events[1:4] if isinstance(e, BlockStored)] == [False] * 3
    assert isinstance(events[4], BlockStored) and events[4].group == 1
    assert events[5] == BlockRemoved((7,), 0, False)


def test_unknown_event_kinds_are_skipped() -> None:
    assert decode_batch(_batch({"type": "SomethingNew", "x": 1}, _stored())) == (
        BlockStored((b"a" * 32,), None, (1, 2), 2, 0, True),
    )


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # a byte msgpack never uses
        b"not msgpack at all",
        bytes(msgpack.packb({"ts": 1})),
        bytes(msgpack.packb([1.0])),
        bytes(msgpack.packb([1.0, "events"])),
        _batch(5),
        _batch(_stored(block_hashes=[])),
        _batch(_stored(block_hashes=["text"])),
        _batch(_stored(parent_block_hash=1.5)),
        _batch(_stored(token_ids=[1, "2"])),
        _batch(_stored(token_ids=None)),
        _batch(_stored(block_size=0)),
        _batch(_stored(block_size=True)),
        _batch(_stored(group_idx=-1)),
        _batch(_stored(extra_keys="salt")),
        _batch({"type": "BlockRemoved", "block_hashes": None}),
    ],
)
def test_junk_is_refused(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_batch(payload)


def test_sequence_frames() -> None:
    assert parse_seq((5).to_bytes(8, "big")) == 5
    assert parse_seq(END_SEQ) == (1 << 64) - 1  # never a real sequence number
    with pytest.raises(EventDecodeError):
        parse_seq(b"\x00\x01")
