"""A prfaas prefill node whose decode node is a vLLM server (``decode_recomputes_last_token``): for
a model with linear-attention states it sends the cache of all but the last prompt token and no
first token (END -1), the session vLLM's connector installs before recomputing that token; a
dense model's cache crosses whole, with its first token. Before, a torch PrfaaS site sent a
hybrid's whole cache to a vLLM PD site, whose connector refused it ("session covers tokens
[0, 300), request needs [0, 299)") and recomputed every such prompt: the transfer was wasted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from prfaas.core import NodeRole
from prfaas.core.clock import VirtualClock
from prfaas.engine.timed import TimedConfig, TimedEngine
from prfaas.engine.waiting import VirtualWaiter
from prfaas.perf import cost_model_for
from prfaas.serve.node.messages import PrefillCommand, SamplingMsg, pack_tokens
from prfaas.serve.node.worker import Node
from prfaas.transfer import Manifest

pytestmark = pytest.mark.timeout(30)
PROMPT = 3000


class _Session:
    def __init__(self) -> None:
        self.bytes = 0
        self.first_token: int | None = None

    async def send(self, _layer: int, _offset: int, view: memoryview) -> None:
        self.bytes += view.nbytes

    async def finish(self, first_token: int = -1) -> None:
        self.first_token = first_token


class _Link:
    """Records the session the node opens."""

    def __init__(self) -> None:
        self.last = _Session()
        self.manifest: Manifest | None = None

    @asynccontextmanager
    async def session(self, manifest: Manifest) -> AsyncIterator[_Session]:
        self.manifest = manifest
        yield self.last


def _node(model: str) -> Node:
    engine = TimedEngine(
        cost_model_for(model, "h200"), VirtualWaiter(VirtualClock()), TimedConfig(byte_divisor=1)
    )
    return Node("pf0", "pf", NodeRole.PREFILL, engine, None)


def _cmd(vllm_decode: bool) -> PrefillCommand:
    return PrefillCommand(
        request_id="r", tokens=pack_tokens(range(PROMPT)), decode_node="d0",
        decode_host="127.0.0.1", decode_transfer_port=1, cross_site=True,
        decode_recomputes_last_token=vllm_decode, sampling=SamplingMsg(max_new_tokens=4),
    )  # fmt: skip


async def _prefill(model: str, vllm_decode: bool) -> tuple[Node, _Link, int, int]:
    """(node, link, tokens of the session, END's first token)."""
    node, link = _node(model), _Link()
    outcome = await node.prefill(_cmd(vllm_decode), link)  # type: ignore[arg-type]
    assert outcome.ok, outcome.error
    assert link.manifest is not None and link.last.first_token is not None
    assert outcome.kv_bytes_sent == link.last.bytes == link.manifest.num_bytes
    return node, link, link.manifest.num_tokens, link.last.first_token


@pytest.mark.parametrize("model", ["qwen3-next-80b-a3b", "paper-1t"])
async def test_a_hybrid_cache_for_a_vllm_decode_server_stops_before_the_last_token(
    model: str,
) -> None:
    node, link, num_tokens, first = await _prefill(model, vllm_decode=True)
    assert num_tokens == PROMPT - 1 and first == -1
    assert link.last.bytes == node.engine.cache_spec.transfer_bytes(PROMPT - 1)
    _, _, whole, sampled = await _prefill(model, vllm_decode=False)  # a prfaas decode node
    assert whole == PROMPT and sampled >= 0


async def test_a_dense_cache_crosses_whole_whoever_decodes() -> None:
    for vllm_decode in (True, False):
        _, _, num_tokens, first = await _prefill("llama-3.1-70b", vllm_decode)
        assert num_tokens == PROMPT and first >= 0
