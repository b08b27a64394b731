"""The gateway's reading of a decode stream (``node_client._events``): a token id below 0 is the
node's failure, not a token. A torch decode node once relayed the -1 a vLLM prefill server's END
carries ("no first token"), and the gateway's detokenizer raised OverflowError: a 500 for the
client instead of a failed attempt."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from prfaas.serve.gateway.node_client import NodeCallFailed, _events

pytestmark = pytest.mark.timeout(30)


async def _lines(*events: dict[str, object]) -> AsyncIterator[str]:
    for event in events:
        yield json.dumps(event)


async def _read(*events: dict[str, object]) -> list[list[int]]:
    return [e.token_ids async for e in _events("d0", _lines(*events))]


def test_tokens_are_relayed_until_the_finish() -> None:
    got = asyncio.run(
        _read(
            {"kind": "ready"},
            {"kind": "tokens", "token_ids": [5, 0]},
            {"kind": "tokens", "token_ids": [7], "finish_reason": "length"},
        )
    )
    assert got == [[], [5, 0], [7]]


def test_a_negative_token_id_fails_the_node_call() -> None:
    with pytest.raises(NodeCallFailed) as failed:
        asyncio.run(_read({"kind": "ready"}, {"kind": "tokens", "token_ids": [-1, 3]}))
    assert failed.value.kind == "rejected" and "token id < 0" in str(failed.value)
