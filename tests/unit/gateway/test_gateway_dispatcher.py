"""The dispatcher against in-memory nodes: routes, retries, rotation after each kind of failure,
aborts, and that every path gives back what it held (gateway-side pending work, decode streams,
running prefills)."""

from __future__ import annotations

import asyncio

import pytest
from gateway_fakes import FakeNodes, Script, heartbeat, make_dispatcher, request

from prfaas.serve.backend import GenerationError, TokenEvent
from prfaas.serve.gateway.dispatcher import ClusterDispatcher
from prfaas.serve.gateway.registry import NodeRegistry

pytestmark = pytest.mark.timeout(30)
NODES = ("pf0", "p0", "p1", "d0", "d1")


async def collect(d: ClusterDispatcher, req_id: str = "r", n: int = 20) -> list[TokenEvent]:
    return [e async for e in d.generate(request(req_id, n))]


def assert_nothing_held(nodes: FakeNodes, registry: NodeRegistry) -> None:
    assert not nodes.open_streams
    assert not nodes.running_prefills
    for node in NODES:
        assert registry.in_flight(node) == 0, node
    for load in registry.view:
        assert load.queue_depth == 0 and load.batch_size == 0, load


def in_rotation(registry: NodeRegistry, node: str) -> bool:
    return registry.rotation(node)[0]


async def test_short_prompt_is_prefilled_locally_and_releases_everything() -> None:
    nodes = FakeNodes()
    d, reg = make_dispatcher(nodes)
    nodes.script("p0").cached_tokens = nodes.script("p1").cached_tokens = 16
    events = await collect(d)
    assert [e.token_ids for e in events] == [(0,), (1,), (2,)]
    assert events[-1].finish_reason == "length"
    assert events[-1].num_cached_tokens == 16  # the prefill's real hit, for usage
    (record,) = d.records
    assert record.prefill_site == "pd" and not record.offloaded and record.attempts == 1
    assert_nothing_held(nodes, reg)


async def test_long_prompt_is_offloaded() -> None:
    nodes = FakeNodes()
    d, reg = make_dispatcher(nodes)
    await collect(d, n=100)
    (record,) = d.records
    assert record.prefill_node == "pf0" and record.offloaded
    assert not record.kv_recomputed
    assert_nothing_held(nodes, reg)


async def test_a_decode_that_recomputed_is_logged_and_counted_as_such() -> None:
    nodes = FakeNodes(scripts={"d0": Script(decode="recompute"), "d1": Script(decode="recompute")})
    d, reg = make_dispatcher(nodes)
    events = await collect(d, n=100)
    assert [t for e in events for t in e.token_ids] == [0, 1, 2]  # the client's answer is whole
    (record,) = d.records
    assert record.offloaded and record.kv_recomputed and record.attempts == 1
    metric = d.metrics.registry.get_sample_value(
        "prfaas_kv_recomputed_total", {"decode_node": record.decode_node}
    )
    assert metric == 1.0
    assert_nothing_held(nodes, reg)


async def test_unreachable_prefill_node_is_quarantined_until_a_later_heartbeat() -> None:
    nodes = FakeNodes({"pf0": Script(prefill="unreachable")})
    d, reg = make_dispatcher(nodes)
    events = await collect(d, n=100)
    assert events[-1].finish_reason == "length"  # retried with local prefill
    (record,) = d.records
    assert record.prefill_site == "pd" and record.attempts == 2
    ok, why = reg.rotation("pf0")
    assert not ok and "unreachable" in why
    assert_nothing_held(nodes, reg)
    now = asyncio.get_running_loop().time()
    heartbeat(reg, "pf0", now)  # inside the quarantine: still out
    assert not in_rotation(reg, "pf0")
    heartbeat(reg, "pf0", now + 10.0)
    assert in_rotation(reg, "pf0")


@pytest.mark.parametrize("failure", ["fail", "reject"])
async def test_a_request_failing_at_a_node_leaves_the_node_in_rotation(failure: str) -> None:
    nodes = FakeNodes({"pf0": Script(prefill=failure)})
    d, reg = make_dispatcher(nodes)
    events = await collect(d, n=100)
    assert events[-1].finish_reason == "length"
    assert d.records[-1].attempts == 2
    assert in_rotation(reg, "pf0")  # a failed request is not a reason to leave rotation
    assert_nothing_held(nodes, reg)


async def test_refusing_decode_node_is_skipped_then_back_after_its_next_report() -> None:
    nodes = FakeNodes({"d0": Script(decode="refuse"), "d1": Script(decode="refuse")})
    d, reg = make_dispatcher(nodes)
    with pytest.raises(GenerationError) as exc_info:
        await collect(d)
    assert exc_info.value.status == 503  # both refused: no decode node in rotation now
    assert not in_rotation(reg, "d0") and not in_rotation(reg, "d1")
    now = asyncio.get_running_loop().time()
    heartbeat(reg, "d0", now + 5.0)  # a report sent after the refusal, not draining
    assert in_rotation(reg, "d0")
    assert await d.ready() is None
    assert_nothing_held(nodes, reg)


async def test_node_returning_500_stays_in_rotation_and_later_requests_succeed() -> None:
    nodes = FakeNodes({"d0": Script(decode="reject"), "d1": Script(decode="reject")})
    d, reg = make_dispatcher(nodes)
    with pytest.raises(GenerationError) as exc_info:
        await collect(d)
    assert exc_info.value.status == 502 and "HTTP 500" in exc_info.value.message
    assert in_rotation(reg, "d0") and in_rotation(reg, "d1")
    nodes.scripts.clear()
    assert (await collect(d, "r2"))[-1].finish_reason == "length"
    assert_nothing_held(nodes, reg)


async def test_decode_error_before_any_token_is_retried() -> None:
    nodes = FakeNodes({"d0": Script(decode="error")})
    d, reg = make_dispatcher(nodes)
    events = await collect(d)
    assert events[-1].finish_reason == "length"
    assert [c[0] for c in nodes.calls if c[1] == "decode"] == ["d0", "d1"]
    assert in_rotation(reg, "d0")
    assert_nothing_held(nodes, reg)


async def test_stream_cut_after_a_token_fails_the_request_with_a_reason() -> None:
    nodes = FakeNodes({"d0": Script(decode="cut"), "d1": Script(decode="cut")})
    d, reg = make_dispatcher(nodes)
    got: list[TokenEvent] = []
    with pytest.raises(GenerationError) as exc_info:
        async for e in d.generate(request()):
            got.append(e)
    assert len(got) == 1  # tokens reached the client: no silent retry
    assert exc_info.value.status == 502 and "peer closed" in exc_info.value.message
    assert not in_rotation(reg, "d0")  # unreachable: quarantined until a heartbeat
    assert_nothing_held(nodes, reg)


async def test_client_gone_after_first_token_aborts_and_releases() -> None:
    nodes = FakeNodes({"d0": Script(num_tokens=50), "d1": Script(num_tokens=50)})
    d, reg = make_dispatcher(nodes)
    gen = d.generate(request(num_prompt_tokens=20, max_tokens=50))
    first = await anext(gen)
    assert first.token_ids == (0,)
    await gen.aclose()
    assert_nothing_held(nodes, reg)


async def test_client_gone_while_prefill_hangs_cancels_and_aborts_it() -> None:
    nodes = FakeNodes({"p0": Script(prefill="hang"), "p1": Script(prefill="hang")})
    d, reg = make_dispatcher(nodes)
    task = asyncio.create_task(collect(d))
    while not nodes.running_prefills:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert nodes.aborted == ["r.1"]
    assert_nothing_held(nodes, reg)


async def test_prefill_answer_after_the_last_token_is_still_booked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A busy prefill host can answer after the decode node streamed every token (seen as a
    # route missing from the log under load): the answer is booked when it lands, not dropped.
    monkeypatch.setattr("prfaas.serve.gateway.relay.ABORT_TIMEOUT_S", 0.01)
    nodes = FakeNodes({"pf0": Script(prefill="late")})
    d, reg = make_dispatcher(nodes)
    events = await collect(d, n=100)
    assert events[-1].finish_reason == "length"
    assert not d.records and nodes.running_prefills  # the client is done, the answer is not
    nodes.answer_late.set()
    for _ in range(100):
        if d.records:
            break
        await asyncio.sleep(0)
    (record,) = d.records
    assert record.prefill_node == "pf0" and record.offloaded and record.kv_bytes > 0
    assert nodes.aborted == []
    assert_nothing_held(nodes, reg)


async def test_closing_the_gateway_aborts_a_late_prefill_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("prfaas.serve.gateway.relay.ABORT_TIMEOUT_S", 0.01)
    nodes = FakeNodes({"pf0": Script(prefill="late")})
    d, reg = make_dispatcher(nodes)
    await collect(d, n=100)
    await d.aclose()
    assert nodes.aborted == ["r.1"] and not d.records
    assert_nothing_held(nodes, reg)


async def test_concurrent_requests_release_everything() -> None:
    nodes = FakeNodes()
    d, reg = make_dispatcher(nodes)
    results = await asyncio.gather(*(collect(d, f"r{i}", 10 + 7 * i) for i in range(24)))
    assert all(r[-1].finish_reason == "length" for r in results)
    assert len(d.records) == 8  # the route log is a ring of route_log_size
    assert_nothing_held(nodes, reg)


async def test_drained_node_takes_no_work_until_resumed() -> None:
    nodes = FakeNodes()
    d, reg = make_dispatcher(nodes)
    reg.drain("d0")
    assert reg.rotation("d0") == (False, "drained by an operator")
    heartbeat(reg, "d0", asyncio.get_running_loop().time() + 5)  # reports do not undo a drain
    for i in range(4):
        await collect(d, f"r{i}")
    assert {c[0] for c in nodes.calls if c[1] == "decode"} == {"d1"}
    reg.resume("d0")
    assert in_rotation(reg, "d0")


async def test_ready_names_what_is_missing() -> None:
    nodes = FakeNodes()
    d, reg = make_dispatcher(nodes)
    assert await d.ready() is None
    reg.drain("d0")
    reg.drain("d1")
    assert "no decode node" in (await d.ready() or "")
    with pytest.raises(GenerationError) as exc_info:
        await collect(d)
    assert exc_info.value.status == 503
    reg.resume("d0")
    for node in ("pf0", "p0", "p1"):
        reg.drain(node)
    assert "no prefill node" in (await d.ready() or "")


async def test_retry_after_a_failed_prefill_avoids_its_decode_node_too() -> None:
    # The prefill failed (say its KV could not reach d0): the retry goes to d1, not back to d0.
    nodes = FakeNodes({"pf0": Script(prefill="fail")})
    d, reg = make_dispatcher(nodes)
    events = await collect(d, n=100)
    assert events[-1].finish_reason == "length"
    decodes = [c[0] for c in nodes.calls if c[1] == "decode"]
    assert len(decodes) == 2 and decodes[0] != decodes[1]
    assert_nothing_held(nodes, reg)


async def test_decode_node_gets_the_prompt_and_the_prefill_node() -> None:
    """Always (issue 12): a vLLM decode node sends the prompt to its server and decodes with a
    plain request when the prefill node shares that server; a torch node still applies the
    repetition penalty only when it is != 1 (engine.torch ignores the prompt at 1.0)."""
    from dataclasses import replace

    from gateway_fakes import request as make_request

    from prfaas.serve.node.messages import unpack_tokens

    d, _ = make_dispatcher(FakeNodes())
    plain = make_request("a")
    penalised = replace(make_request("b"), repetition_penalty=1.3)
    hashes: tuple[int, ...] = ()
    plan_a = d.planner.plan(plain, hashes, 1, False)
    decode_a, _ = d.planner.commands(plain, hashes, plan_a)
    decode_b, _ = d.planner.commands(penalised, hashes, d.planner.plan(penalised, hashes, 1, False))
    assert unpack_tokens(decode_a.prompt_tokens) == plain.prompt_token_ids
    assert decode_a.prefill_node == plan_a.decision.prefill_node != ""
    assert unpack_tokens(decode_b.prompt_tokens) == penalised.prompt_token_ids
    assert decode_b.sampling.repetition_penalty == 1.3
