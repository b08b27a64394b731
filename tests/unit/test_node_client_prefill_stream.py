"""``HttpNodeClient.prefill_streamed`` (a pool front door's call to a pool node): the node's
``computed`` line is passed on before its outcome line is returned; an answer cut after
``computed`` and before the outcome is a lost node (``unreachable``), never a success; a 409 is
``refused`` as for ``prefill``."""

from __future__ import annotations

import httpx
import pytest

from prfaas.serve.gateway.node_client import HttpNodeClient, NodeCallFailed
from prfaas.serve.node.messages import (
    NodeEndpoint,
    PrefillCommand,
    PrefillOutcome,
    PrefillStep,
    SamplingMsg,
)

pytestmark = pytest.mark.timeout(30)
EP = NodeEndpoint(node="n0", site="g", role="prefill", host="127.0.0.1", http_port=1)
CMD = PrefillCommand(request_id="s1", tokens="", decode_node="d0", decode_host="127.0.0.1",
                     decode_transfer_port=9, cross_site=True,
                     sampling=SamplingMsg(max_new_tokens=1))  # fmt: skip
COMPUTED = PrefillStep(kind="computed").model_dump_json() + "\n"
OUTCOME = PrefillStep(kind="outcome", outcome=PrefillOutcome(request_id="s1", ok=True))


def _client(status: int, body: str) -> HttpNodeClient:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/nodes/n0/prefill/stream"
        return httpx.Response(status, text=body, headers={"content-type": "application/x-ndjson"})

    client = HttpNodeClient()
    client._client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return client


async def test_computed_comes_before_the_outcome() -> None:
    said: list[str] = []
    client = _client(200, COMPUTED + OUTCOME.model_dump_json() + "\n")
    out = await client.prefill_streamed(EP, CMD, lambda: said.append("computed"))
    assert out.ok and said == ["computed"]
    await client.aclose()


async def test_an_answer_cut_after_computed_is_a_lost_node() -> None:
    said: list[str] = []
    client = _client(200, COMPUTED)
    with pytest.raises(NodeCallFailed) as err:
        await client.prefill_streamed(EP, CMD, lambda: said.append("computed"))
    assert err.value.kind == "unreachable" and said == ["computed"]
    await client.aclose()


async def test_a_draining_node_refuses() -> None:
    client = _client(409, "node n0 is not accepting prefills")
    with pytest.raises(NodeCallFailed) as err:
        await client.prefill_streamed(EP, CMD, lambda: None)
    assert err.value.kind == "refused"
    await client.aclose()
