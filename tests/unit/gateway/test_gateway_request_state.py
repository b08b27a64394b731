"""The dispatcher moves each live request through ``core.RequestState``'s one table: the path
each request took, retries allowed only where the table allows them, every end recorded."""

from __future__ import annotations

import asyncio

import pytest
from gateway_fakes import FakeNodes, Script, make_dispatcher, request

from prfaas.core import RequestState
from prfaas.serve.backend import GenerationError
from prfaas.serve.gateway.dispatcher import ClusterDispatcher

pytestmark = pytest.mark.timeout(30)
S = RequestState


async def _run(d: ClusterDispatcher, req_id: str = "r", n: int = 20) -> None:
    async for _ in d.generate(request(req_id, n)):
        pass


async def test_a_served_request_passes_every_stage_in_order() -> None:
    d, _ = make_dispatcher(FakeNodes())
    await _run(d)
    (life,) = d.ended
    # The fake prefill answers before the decode node's first token: TRANSFERRING in between.
    assert life.path == [S.QUEUED, S.ROUTED, S.PREFILLING, S.TRANSFERRING, S.DECODING, S.FINISHED]
    assert life.num_attempts == 1 and not d.lifecycles


async def test_a_retry_routes_again_before_any_token() -> None:
    d, _ = make_dispatcher(FakeNodes({"d0": Script(decode="error")}))
    await _run(d)
    (life,) = d.ended
    assert life.path[:4] == [S.QUEUED, S.ROUTED, S.PREFILLING, S.TRANSFERRING]
    assert life.path[4] is S.ROUTED and life.path[-1] is S.FINISHED
    assert life.num_attempts == 2


async def test_a_stream_cut_after_a_token_fails_without_a_retry() -> None:
    d, _ = make_dispatcher(FakeNodes({"d0": Script(decode="cut"), "d1": Script(decode="cut")}))
    with pytest.raises(GenerationError):
        await _run(d)
    (life,) = d.ended
    assert life.path[-2:] == [S.DECODING, S.FAILED] and life.num_attempts == 1


async def test_a_client_gone_mid_prefill_is_aborted_and_in_flight_until_then() -> None:
    nodes = FakeNodes({"p0": Script(prefill="hang"), "p1": Script(prefill="hang")})
    d, _ = make_dispatcher(nodes)
    task = asyncio.create_task(_run(d))
    while not nodes.running_prefills:
        await asyncio.sleep(0)
    assert d.lifecycles["r"].state is S.PREFILLING
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (life,) = d.ended
    assert life.path[-2:] == [S.PREFILLING, S.ABORTED] and not d.lifecycles
