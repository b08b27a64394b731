"""The dispatcher's bounded wait for a path (``policy.WaitingRoom``): a request that arrives while
the only decode node is restarting waits and completes when it is back; past the wait limit it gets
a 503 that names the reason."""

from __future__ import annotations

import asyncio

import pytest
from gateway_fakes import FakeNodes, heartbeat, make_dispatcher, request

from prfaas.serve.backend import GenerationError, TokenEvent
from prfaas.serve.gateway.dispatcher import ClusterDispatcher
from prfaas.serve.gateway.registry import NodeRegistry

pytestmark = pytest.mark.timeout(30)


async def collect(d: ClusterDispatcher, req_id: str = "r") -> list[TokenEvent]:
    return [e async for e in d.generate(request(req_id, 20))]


def restarting_only_decode_node(reg: NodeRegistry) -> None:
    """d1 is drained by an operator; d0 could not be reached (its process restarts)."""
    reg.drain("d1")
    reg.mark_unreachable("d0", "connection refused", asyncio.get_running_loop().time())
    assert not reg.rotation("d0")[0]


def waits(d: ClusterDispatcher, outcome: str) -> float:
    value = d.metrics.registry.get_sample_value("prfaas_path_waits_total", {"outcome": outcome})
    return value or 0.0


async def test_a_request_waits_for_the_restarting_decode_node_and_completes() -> None:
    nodes = FakeNodes()
    d, reg = make_dispatcher(nodes, path_wait_s=20.0)
    restarting_only_decode_node(reg)
    task = asyncio.create_task(collect(d))
    await asyncio.sleep(0.1)
    assert not task.done()  # waiting, not refused
    assert not any(call[1] == "decode" for call in nodes.calls)
    heartbeat(reg, "d0", asyncio.get_running_loop().time() + 10.0)  # back, after its quarantine
    events = await asyncio.wait_for(task, 10)
    assert events[-1].finish_reason == "length"
    assert {c[0] for c in nodes.calls if c[1] == "decode"} == {"d0"}
    assert waits(d, "served") == 1 and waits(d, "refused") == 0


async def test_past_the_wait_limit_the_request_gets_503_naming_the_reason() -> None:
    nodes = FakeNodes()
    d, reg = make_dispatcher(nodes, path_wait_s=0.2)
    restarting_only_decode_node(reg)
    with pytest.raises(GenerationError) as exc_info:
        await collect(d)
    err = exc_info.value
    assert err.status == 503
    assert "no decode node in rotation" in err.message
    assert "waited 0.2 s" in err.message
    assert "d0: unreachable" in err.message and "d1: drained by an operator" in err.message
    assert not nodes.calls  # nothing was sent anywhere
    assert waits(d, "refused") == 1


async def test_no_wait_refuses_at_once() -> None:
    nodes = FakeNodes()
    d, reg = make_dispatcher(nodes, path_wait_s=0.0)
    restarting_only_decode_node(reg)
    with pytest.raises(GenerationError) as exc_info:
        await collect(d)
    assert exc_info.value.status == 503 and "d0: unreachable" in exc_info.value.message
    assert waits(d, "refused") == 0  # it never waited
