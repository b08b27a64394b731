"""``Relay`` without HTTP: failures become ApiError, deadlines hold, close() aborts the backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from prfaas.serve.api.errors import ApiError
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.api.relay import Relay
from prfaas.serve.api.tokenizer import ByteTokenizer
from prfaas.serve.api.tracking import RequestTracker
from prfaas.serve.backend import GenerationError, GenerationRequest, ModelInfo, TokenEvent

pytestmark = pytest.mark.timeout(10)
REQ = GenerationRequest("r1", (1, 2, 3), 4, 0.0, 1.0, None, (), 0.0)


class Scripted:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.aborted = False

    def model_info(self) -> ModelInfo:
        return ModelInfo("m", 64)

    async def health(self) -> dict[str, Any]:
        return {"status": "ok"}

    def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self.mode == "raise_on_call":
            raise GenerationError(503, "service_unavailable", "no decode node available")
        return self._gen()

    async def _gen(self) -> AsyncIterator[TokenEvent]:
        try:
            if self.mode == "hang":
                await asyncio.sleep(3600)
            for t in b"abcdefgh":  # 8 tokens, twice max_tokens
                yield TokenEvent((t,))
                if self.mode == "slow":
                    await asyncio.sleep(3600)
        finally:
            self.aborted = True


def relay(backend: Scripted, timeout_s: float = 5.0) -> Relay:
    tracker = RequestTracker(GatewayMetrics(), "completions")
    r = Relay(backend, REQ, ByteTokenizer(), tracker, timeout_s=timeout_s, buffer_events=2)
    r.start()
    return r


async def test_error_raised_when_generate_is_called() -> None:
    with pytest.raises(ApiError) as info:
        await relay(Scripted("raise_on_call")).next()
    assert info.value.status == 503


async def test_deadline_is_504_and_aborts_the_backend() -> None:
    backend = Scripted("hang")
    r = relay(backend, timeout_s=0.05)
    with pytest.raises(ApiError) as info:
        await r.next()
    assert info.value.status == 504
    await r.close()
    assert backend.aborted


async def test_overrun_is_capped_and_the_backend_aborted() -> None:
    backend = Scripted("fast")
    r = relay(backend)
    deltas = [d async for d in r.deltas()]
    assert "".join(d.text for d in deltas) == "abcd"
    assert deltas[-1].finish_reason == "length" and r.num_tokens == 4
    assert backend.aborted


async def test_close_mid_generation_raises_generator_exit_in_backend() -> None:
    backend = Scripted("slow")
    r = relay(backend)
    assert (await r.next()) is not None
    assert not backend.aborted
    await r.close()
    assert backend.aborted


async def test_waiting_events_are_merged_up_to_the_finish() -> None:
    class Burst(Scripted):
        async def _gen(self) -> AsyncIterator[TokenEvent]:
            for t in b"xyz":
                yield TokenEvent((t,))
            yield TokenEvent((), "stop")

    tracker = RequestTracker(GatewayMetrics(), "completions")
    req = GenerationRequest("r2", (1,), 10, 0.0, 1.0, None, (), 0.0)
    r = Relay(Burst("fast"), req, ByteTokenizer(), tracker, timeout_s=5.0, buffer_events=16)
    r.start()
    await asyncio.sleep(0.05)  # let the backend run ahead of the client
    delta = await r.next()
    assert delta is not None
    assert (delta.text, delta.finish_reason) == ("xyz", "stop")
    assert (await r.next()) is None and tracker.num_tokens == 3
