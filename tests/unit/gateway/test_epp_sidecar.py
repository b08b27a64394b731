"""The decode-side sidecar (``prfaas epp-sidecar``) over in-memory nodes: the picker's headers pin
the route (prefill where ``x-prfaas-prefill-node`` says, decode on the named node of this pod); a
lost prefill is retried locally by the gateway's own dispatcher, decode still here; no headers:
the local route; a decode node that is not this pod's is refused."""

from __future__ import annotations

import json

import httpx
import pytest
from gateway_fakes import DEPLOYMENT, ROLE_OF, SITE_OF, FakeNodes

from prfaas.serve.api import ByteTokenizer
from prfaas.serve.backend import ModelInfo
from prfaas.serve.epp.sidecar import create_sidecar, register_endpoints

pytestmark = pytest.mark.timeout(30)


def sidecar(nodes: FakeNodes) -> tuple[httpx.AsyncClient, object]:
    app, registry, dispatcher = create_sidecar(
        DEPLOYMENT, ByteTokenizer(), ModelInfo("paper-1t", 100_000), frozenset({"d0", "d1"})
    )
    dispatcher.nodes = nodes
    rows = [
        {"node": n, "site": SITE_OF[n], "role": ROLE_OF[n], "host": "mem", "http_port": 1,
         "transfer_port": 2}
        for n in SITE_OF
    ]  # fmt: skip
    assert register_endpoints(registry, rows, 0.0) == len(SITE_OF)
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://sidecar"), dispatcher


BODY = {"model": "paper-1t", "prompt": "y" * 200, "max_tokens": 3}


def served(nodes: FakeNodes) -> list[tuple[str, str]]:
    return [(node, kind) for node, kind, _ in nodes.calls]


async def test_the_pickers_headers_pin_the_route() -> None:
    nodes = FakeNodes()
    client, _ = sidecar(nodes)
    async with client:
        headers = {"x-prfaas-decode-node": "d1", "x-prfaas-prefill-node": "pf0",
                   "x-prfaas-cached-tokens": "0"}  # fmt: skip
        r = await client.post("/v1/completions", json=BODY, headers=headers)
    assert r.status_code == 200, r.text
    assert json.loads(r.text)["usage"]["completion_tokens"] == 3
    assert sorted(served(nodes)) == [("d1", "decode"), ("pf0", "prefill")]
    cmd = nodes.prefill_commands[0]
    assert cmd.decode_node == "d1" and cmd.cross_site


async def test_a_lost_prefill_is_retried_locally_decode_still_here() -> None:
    nodes = FakeNodes()
    nodes.script("pf0").prefill = "unreachable"
    client, dispatcher = sidecar(nodes)
    async with client:
        headers = {"x-prfaas-decode-node": "d0", "x-prfaas-prefill-node": "pf0"}
        r = await client.post("/v1/completions", json=BODY, headers=headers)
    assert r.status_code == 200, r.text
    prefills = [n for n, kind in served(nodes) if kind == "prefill"]
    assert prefills[0] == "pf0" and prefills[-1] in ("p0", "p1")
    assert {n for n, kind in served(nodes) if kind == "decode"} == {"d0"}
    assert dispatcher.records[-1].attempts == 2  # type: ignore[attr-defined]


async def test_without_headers_the_route_is_local_and_other_pods_nodes_are_refused() -> None:
    nodes = FakeNodes()
    client, _ = sidecar(nodes)
    async with client:
        r = await client.post("/v1/completions", json=BODY)
        assert r.status_code == 200, r.text
        assert {n for n, _ in served(nodes)} <= {"p0", "p1", "d0"}
        r = await client.post("/v1/completions", json=BODY,
                              headers={"x-prfaas-decode-node": "d9"})  # fmt: skip
        assert r.status_code == 421
        assert "not served here" in r.json()["error"]["message"]
