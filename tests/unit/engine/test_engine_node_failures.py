"""A node around an engine (the timed one, or one that fails on purpose): whatever the engine or
the transfer raises, a prefill returns ``ok=False`` with the reason and a decode stream ends with an
error event; other requests go on; an engine fault shows in the node's report."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from prfaas.core import NodeRole
from prfaas.core.clock import VirtualClock
from prfaas.engine import EngineDead, LayerOutput, PrefillRequest, PrefillResult, TokenEvent
from prfaas.engine.timed import TimedConfig, TimedEngine
from prfaas.engine.waiting import VirtualWaiter
from prfaas.perf import cost_model_for
from prfaas.serve.node.messages import (
    DecodeCommand,
    DecodeEvent,
    PrefillCommand,
    SamplingMsg,
    pack_tokens,
)
from prfaas.serve.node.worker import Node
from prfaas.transfer import Manifest, TransferError


class _Session:
    def __init__(self, fail: bool) -> None:
        self.fail, self.sent, self.first = fail, 0, None

    async def send(self, _layer: int, _offset: int, view: memoryview) -> None:
        if self.fail:
            raise TransferError("peer went away")
        self.sent += view.nbytes

    async def finish(self, first_token: int | None = None) -> None:
        self.first = first_token


class _Link:
    def __init__(self, fail: bool = False) -> None:
        self.last = _Session(fail)

    @asynccontextmanager
    async def session(self, _manifest: Manifest) -> AsyncIterator[_Session]:
        yield self.last


class _Flaky(TimedEngine):
    """Timed, except that a prompt starting with 666 raises mid-prefill and ``step_fault`` makes
    decode steps raise (``dead`` also sets ``fault``, like a dead torch engine thread)."""

    step_fault: Exception | None = None

    @property
    def fault(self) -> str:
        return str(self.step_fault) if isinstance(self.step_fault, EngineDead) else ""

    async def prefill_stream(
        self, req: PrefillRequest
    ) -> AsyncIterator[LayerOutput | PrefillResult]:
        async for item in super().prefill_stream(req):
            if req.token_ids[0] == 666:
                raise RuntimeError("kernel exploded")
            yield item

    async def step_async(self) -> tuple[TokenEvent, ...]:
        if self.step_fault is not None:
            raise self.step_fault
        return await super().step_async()

    def install(self, allocation: Any, first_token: int, sampling: Any, *args: Any) -> TokenEvent:
        if first_token == 666:
            raise KeyError("unexpected")
        return super().install(allocation, first_token, sampling, *args)


def _node(role: NodeRole) -> Node:
    engine = _Flaky(
        cost_model_for("paper-1t", "h200"),
        VirtualWaiter(VirtualClock()),
        TimedConfig(byte_divisor=1000),
    )
    return Node("n", "s", role, engine, None)


def _prefill_cmd(rid: str, tokens: Sequence[int], **sampling: Any) -> PrefillCommand:
    return PrefillCommand(
        request_id=rid,
        tokens=pack_tokens(tokens),
        decode_node="d",
        decode_host="127.0.0.1",
        decode_transfer_port=1,
        cross_site=False,
        sampling=SamplingMsg(max_new_tokens=8, **sampling),
    )


@pytest.mark.timeout(30)
async def test_prefill_failures_are_outcomes_with_a_reason() -> None:
    node = _node(NodeRole.PREFILL)
    ok = await node.prefill(_prefill_cmd("ok", range(100)), _Link())
    assert ok.ok and ok.kv_bytes_sent > 0
    cases = [
        (_prefill_cmd("mt", range(100), min_tokens=9), _Link(), "min_tokens"),
        (_prefill_cmd("boom", [666, *range(99)]), _Link(), "RuntimeError: kernel exploded"),
        (_prefill_cmd("net", range(100)), _Link(fail=True), "TransferError: peer went away"),
        (_prefill_cmd("long", range(200_000)), _Link(), "PromptTooLong"),
    ]
    for cmd, link, reason in cases:
        outcome = await node.prefill(cmd, link)
        assert not outcome.ok and reason in outcome.error, outcome
    assert (await node.prefill(_prefill_cmd("after", range(50)), _Link())).ok
    assert node.idle and node.report().fault == ""


async def _events(stream: AsyncIterator[DecodeEvent], into: list[DecodeEvent]) -> None:
    async for event in stream:
        into.append(event)


async def _expect(node: Node, rid: str, first: int = 1, **sampling: Any) -> list[DecodeEvent]:
    """Open a decode stream for ``rid`` and land its (made-up) KV; returns its event list."""
    cmd = DecodeCommand(
        request_id=rid, num_prompt_tokens=100, sampling=SamplingMsg(max_new_tokens=8, **sampling)
    )
    events: list[DecodeEvent] = []
    asyncio.get_running_loop().create_task(_events(node.decode(cmd), events))
    await asyncio.sleep(0)
    if node.expects(rid):
        node.allocate(Manifest.from_layout(rid, node.engine.layout(100)))
        node.on_delivered(rid, first)
    return events


@pytest.mark.timeout(30)
async def test_decode_failures_end_that_stream_only() -> None:
    node = _node(NodeRole.DECODE)
    engine: _Flaky = node.engine
    loop = asyncio.get_running_loop().create_task(node.decode_loop())
    try:
        bad = await _expect(node, "mt", min_tokens=9)
        crash = await _expect(node, "install", first=666)
        good = await _expect(node, "good")
        async with asyncio.timeout(10):
            while not good or good[-1].finish_reason is None:
                await asyncio.sleep(0.001)
        assert [e.kind for e in bad] == ["error"] and "min_tokens" in bad[0].error
        assert crash[-1].kind == "error" and "KeyError" in crash[-1].error
        assert sum(len(e.token_ids) for e in good) == 8
        # A step that fails as a whole fails the running requests; the loop goes on.
        engine.step_fault = RuntimeError("step broke")
        hit = await _expect(node, "hit")
        async with asyncio.timeout(10):
            while not hit or hit[-1].kind != "error":
                await asyncio.sleep(0.001)
        assert "step broke" in hit[-1].error
        engine.step_fault = None
        again = await _expect(node, "again")
        async with asyncio.timeout(10):
            while not again or again[-1].finish_reason is None:
                await asyncio.sleep(0.001)
        assert engine.budget.used_bytes == 0 and node.report().fault == ""
        # A dead engine: the node reports the fault, waiting streams fail, new ones at once.
        cmd = DecodeCommand(
            request_id="pending", num_prompt_tokens=100, sampling=SamplingMsg(max_new_tokens=8)
        )
        pending: list[DecodeEvent] = []
        asyncio.get_running_loop().create_task(_events(node.decode(cmd), pending))
        await asyncio.sleep(0)
        assert node.expects("pending")  # its KV has yet to come
        waiting = await _expect(node, "waiting")
        engine.step_fault = EngineDead("engine thread died: RuntimeError: device lost")
        async with asyncio.timeout(10):
            while (
                not waiting
                or waiting[-1].kind != "error"
                or not pending
                or pending[-1].kind != "error"
            ):
                await asyncio.sleep(0.001)
        assert "device lost" in waiting[-1].error and "device lost" in pending[-1].error
        assert "device lost" in node.report().fault
        late = await _expect(node, "late")
        assert [e.kind for e in late] == ["error"] and "device lost" in late[0].error
    finally:
        loop.cancel()


class _Gated(_Flaky):
    """Holds its prefill before the first layer, as an engine does while other prefills run."""

    gate: asyncio.Event

    async def prefill_stream(
        self, req: PrefillRequest
    ) -> AsyncIterator[LayerOutput | PrefillResult]:
        await self.gate.wait()
        async for item in super().prefill_stream(req):
            yield item


class _CountingLink(_Link):
    def __init__(self) -> None:
        super().__init__()
        self.opened = 0

    @asynccontextmanager
    async def session(self, _manifest: Manifest) -> AsyncIterator[_Session]:
        self.opened += 1
        yield self.last


@pytest.mark.timeout(30)
async def test_the_session_opens_with_the_first_layer_not_while_the_prefill_waits() -> None:
    """A queued prefill must not hold an open session: the receiver aborts one that makes no
    progress for its stall timeout (the fidelity bench lost requests queued longer than 30 s)."""
    engine = _Gated(
        cost_model_for("paper-1t", "h200"),
        VirtualWaiter(VirtualClock()),
        TimedConfig(byte_divisor=1000),
    )
    engine.gate = asyncio.Event()
    node = Node("n", "s", NodeRole.PREFILL, engine, None)
    link = _CountingLink()
    task = asyncio.create_task(node.prefill(_prefill_cmd("q", range(100)), link))
    for _ in range(20):
        await asyncio.sleep(0)
    assert link.opened == 0 and not task.done()
    engine.gate.set()
    outcome = await task
    assert outcome.ok and link.opened == 1 and link.last.sent == outcome.kv_bytes_sent > 0
