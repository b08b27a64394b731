"""A pool prefill handed back mid-stream, over the real transfer engine (in memory): the noticed
prefill node aborts its KV session with ``HANDED_BACK`` (its command says another node will send
the same session), the decode node frees that attempt's buffers and keeps expecting the session,
and a second prefill node, another sender, delivers it under the same request id: the decode
stream gets its tokens, never an error. Without the command's flag (a gateway's own prefill,
routed again as new) the hand-back still fails the decode stream, as before."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from prfaas.core import NodeRole
from prfaas.core.clock import VirtualClock
from prfaas.engine import LayerOutput, PrefillRequest, PrefillResult
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
from prfaas.serve.node.notice import NoticeDesk
from prfaas.serve.node.worker import Node
from prfaas.transfer import AbortCode, Link, Receiver, SessionAborted, TransferConfig
from prfaas.transfer.inbound import InboundSession

pytestmark = pytest.mark.timeout(30)
RID = "s-r1"
CFG = TransferConfig(psk=b"tenant-a-pool-key-0123456789abcdef", name="tenant-a")


class _Stalls(TimedEngine):
    """Hands out its first layer, then waits (a long prefill under way when its notice comes)."""

    first_layer_out: asyncio.Event
    never: asyncio.Event

    async def prefill_stream(
        self, req: PrefillRequest
    ) -> AsyncIterator[LayerOutput | PrefillResult]:
        async for item in super().prefill_stream(req):
            yield item
            self.first_layer_out.set()
            await self.never.wait()


def _engine(cls: type[TimedEngine] = TimedEngine) -> TimedEngine:
    return cls(
        cost_model_for("paper-1t", "h200"),
        VirtualWaiter(VirtualClock()),
        TimedConfig(byte_divisor=1000),
    )


def _cmd(keep_session: bool) -> PrefillCommand:
    return PrefillCommand(
        request_id=RID, tokens=pack_tokens(range(2000)), store_prefix=False, decode_node="d",
        decode_host="127.0.0.1", decode_transfer_port=1, cross_site=True,
        sampling=SamplingMsg(max_new_tokens=4), keep_session_on_hand_back=keep_session,
    )  # fmt: skip


async def _consume(rx: Receiver, decode: Node, aborts: list[SessionAborted]) -> None:
    """What the decode node's host does with each session (``WorkerHost._complete``)."""

    async def one(session: InboundSession) -> None:
        try:
            delivery = await session.complete(timeout_s=10.0)
        except SessionAborted as exc:
            aborts.append(exc)
            decode.on_transfer_failed(session.manifest.request_id, exc)
            return
        decode.on_delivered(session.manifest.request_id, delivery.first_token)

    async with asyncio.TaskGroup() as tg:
        async for session in rx:
            tg.create_task(one(session))


async def _hand_back_then_resend(keep_session: bool) -> tuple[list[DecodeEvent], list[int]]:
    """The decode stream's events and the abort codes its receiver saw."""
    decode = Node("d", "tenant", NodeRole.DECODE, _engine(), None)
    events: list[DecodeEvent] = []
    aborts: list[SessionAborted] = []
    stream = DecodeCommand(request_id=RID, num_prompt_tokens=2000, timeout_s=10.0,
                           sampling=SamplingMsg(max_new_tokens=4))  # fmt: skip

    async def collect() -> None:
        async for e in decode.decode(stream):
            events.append(e)

    async with Receiver(CFG, decode.allocate) as rx, contextlib.AsyncExitStack() as stack:
        tasks = [asyncio.create_task(t) for t in (collect(), decode.decode_loop(),
                                                  _consume(rx, decode, aborts))]  # fmt: skip
        try:
            stalls = _engine(_Stalls)
            assert isinstance(stalls, _Stalls)
            stalls.first_layer_out, stalls.never = asyncio.Event(), asyncio.Event()
            noticed = Node("pool-0", "g", NodeRole.PREFILL, stalls, None, fixed_role=True)
            noticed.notice = NoticeDesk(lambda _tokens, _kv: 100.0)  # would not end in time
            link0 = await stack.enter_async_context(await Link.in_memory(rx, CFG))
            prefill = asyncio.create_task(noticed.prefill(_cmd(keep_session), link0))
            async with asyncio.timeout(5):
                await stalls.first_layer_out.wait()  # its session is open, a layer sent
            now = time.monotonic()  # the node's clock for its desk
            plan = noticed.notice.notice(now, now + 1.0)
            assert plan.hand_back == (RID,)
            prefill.cancel()  # what the node app does to a handed-back prefill
            with pytest.raises(asyncio.CancelledError):
                await prefill
            async with asyncio.timeout(5):
                while not aborts:
                    await asyncio.sleep(0.01)
            if keep_session:
                assert decode.expects(RID) and decode.engine.budget.used_bytes == 0
                other = Node("pool-1", "g", NodeRole.PREFILL, _engine(), None, fixed_role=True)
                link1 = await stack.enter_async_context(await Link.in_memory(rx, CFG))
                outcome = await other.prefill(_cmd(keep_session), link1)
                assert outcome.ok, outcome
            async with asyncio.timeout(10):
                while not events or (events[-1].kind != "error" and not events[-1].finish_reason):
                    await asyncio.sleep(0.01)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
        assert decode.engine.budget.used_bytes == 0  # nothing of either attempt left behind
    return events, [int(a.code) for a in aborts]


async def test_a_handed_back_session_is_sent_again_by_another_node() -> None:
    events, codes = await _hand_back_then_resend(keep_session=True)
    assert codes == [AbortCode.HANDED_BACK]
    kinds = [e.kind for e in events]
    assert kinds[0] == "ready" and "error" not in kinds
    assert sum(len(e.token_ids) for e in events) > 0 and events[-1].finish_reason == "length"


async def test_without_the_flag_a_hand_back_fails_the_decode_stream_as_before() -> None:
    events, codes = await _hand_back_then_resend(keep_session=False)
    assert codes == [AbortCode.CANCELLED]
    assert events[-1].kind == "error" and "KV transfer" in events[-1].error
