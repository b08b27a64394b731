"""Units of the gateway HTTP surface: admission, detokenization, chat rendering, the backend
dataclasses' validation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from prfaas.serve.api.admission import Admission, Overloaded
from prfaas.serve.api.config import GatewayHTTPConfig
from prfaas.serve.api.tokenizer import ByteTokenizer, IncrementalDetokenizer, render_chat
from prfaas.serve.backend import GenerationError, GenerationRequest, ModelInfo, TokenEvent

pytestmark = pytest.mark.timeout(10)


async def test_admission_hands_slots_over_in_order() -> None:
    adm = Admission(max_in_flight=1, max_queued=2)
    first = await adm.acquire(1.0)
    order: list[str] = []

    async def waiter(name: str) -> None:
        permit = await adm.acquire(5.0)
        order.append(name)
        permit.release()

    tasks = [asyncio.create_task(waiter("b")), asyncio.create_task(waiter("c"))]
    await asyncio.sleep(0)
    assert (adm.num_in_flight, adm.num_queued) == (1, 2)
    with pytest.raises(Overloaded, match="queued"):
        await adm.acquire(1.0)  # queue full: refused at once
    first.release()
    first.release()  # idempotent: must not free a second slot
    await asyncio.gather(*tasks)
    assert order == ["b", "c"]
    assert (adm.num_in_flight, adm.num_queued) == (0, 0)


async def test_admission_timeout_and_cancel_leave_no_trace() -> None:
    adm = Admission(max_in_flight=1, max_queued=2)
    held = await adm.acquire(1.0)
    with pytest.raises(Overloaded, match="within"):
        await adm.acquire(0.01)
    task = asyncio.create_task(adm.acquire(5.0))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert adm.num_queued == 0
    held.release()
    assert adm.num_in_flight == 0
    assert (await adm.acquire(0.01)) is not None


async def test_slot_handed_to_a_cancelled_waiter_is_passed_on() -> None:
    adm = Admission(max_in_flight=1, max_queued=2)
    held = await adm.acquire(1.0)
    doomed = asyncio.create_task(adm.acquire(5.0))
    later = asyncio.create_task(adm.acquire(5.0))
    await asyncio.sleep(0)
    held.release()  # hands the slot to `doomed`...
    doomed.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await doomed
    (await later).release()
    assert (adm.num_in_flight, adm.num_queued) == (0, 0)


def test_incremental_detokenizer_never_splits_a_character() -> None:
    tok = ByteTokenizer()
    text = "héllo, wörld € 😀!"
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add([b]) for b in tok.encode(text)]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == text


def test_incremental_detokenizer_flushes_an_incomplete_tail() -> None:
    detok = IncrementalDetokenizer(ByteTokenizer())
    assert detok.add(list(b"ab")) == "ab"
    assert detok.add([0xE2, 0x82]) == ""  # two bytes of a three-byte character
    assert detok.flush() == "\ufffd"


def test_render_chat_plain_join_and_template() -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert bytes(render_chat(ByteTokenizer(), msgs)) == b"system: s\nuser: u\nassistant:"

    class Templated(ByteTokenizer):
        chat_template = "jinja..."

        def apply_chat_template(
            self, messages: Any, tokenize: bool, add_generation_prompt: bool
        ) -> str:
            assert not tokenize and add_generation_prompt
            return "|".join(m["content"] for m in messages) + "|>"

    assert bytes(render_chat(Templated(), msgs)) == b"s|u|>"


def test_backend_dataclasses_validate() -> None:
    with pytest.raises(ValueError, match="finish_reason"):
        TokenEvent((1,), "eos")
    with pytest.raises(ValueError, match="empty prompt"):
        GenerationRequest("r", (), 1, 0.0, 1.0, None, (), 0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        GenerationRequest("r", (1,), 0, 0.0, 1.0, None, (), 0.0)
    with pytest.raises(ValueError, match="max_context_tokens"):
        ModelInfo("m", 1)
    with pytest.raises(ValueError, match="4xx or 5xx"):
        GenerationError(200, "x", "y")
    err = GenerationError(503, "service_unavailable", "no decode node available")
    assert (err.status, err.error_type, str(err)) == (
        503,
        "service_unavailable",
        "no decode node available",
    )


@pytest.mark.parametrize(
    "kwargs",
    [{"max_in_flight": 0}, {"max_queued": -1}, {"request_timeout_s": 0}, {"retry_after_s": 0}],
)
def test_config_names_the_bad_value(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        GatewayHTTPConfig(**kwargs)
