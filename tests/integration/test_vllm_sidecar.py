"""The vLLM sidecar's logic against a FAKE vLLM server (``fake_vllm.py``: /health, /metrics,
/v1/completions with token ids, and the connector's agent socket), started by the sidecar itself
through a fake "python": registration at once with the fault "vLLM server starting" until
/health answers; the remote prefill's and decode's ``kv_transfer_params`` as the contract says;
the co-located shortcut (no prefill call, a plain decode request); aborts reaching the agent;
reports from /metrics and agent stats; a killed server noticed, restarted, the fault cleared; and
the server's whole process group gone when the sidecar stops. The prefix report: the fake's KV
cache events (its blocks of 8 tokens) reach the gateway's ``KVMirror`` as prfaas entries (blocks
of 16), a decode node's "ready" says what its server holds, a lost message is replayed, junk and
a clear empty the report, and a restarted server's report starts again empty under a new epoch.
Fast: no vLLM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from prfaas.cache.mirror import KVMirror
from prfaas.config import DeploymentConfig
from prfaas.core.ids import SiteId
from prfaas.serve.auth import SignedAuth, Verifier
from prfaas.serve.auth_middleware import SignatureMiddleware
from prfaas.serve.gateway.hashing import block_hashes
from prfaas.serve.listeners import bind, server_for
from prfaas.serve.node.app import create_node_app
from prfaas.serve.node.messages import (
    DecodeCommand,
    DecodeEvent,
    Heartbeat,
    PrefillCommand,
    PrefillOutcome,
    PrefixAckMsg,
    Registration,
    SamplingMsg,
    pack_tokens,
)
from prfaas.serve.vllm.host import VllmHost

pytestmark = pytest.mark.timeout(120)

PSK = "sidecar-test-key-0123456789"
FAKE = Path(__file__).with_name("fake_vllm.py")
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
SLOW = [*PROMPT, 511]
"""The fake takes its time with this prompt (fake_vllm.SLOW_TOKEN)."""
RECOMPUTE_TOKEN = 510
"""The fake's decode "recomputes" a prompt holding it (fake_vllm.RECOMPUTE_TOKEN)."""
BLOCK = 16
"""The deployment's prfaas block (the fake's vLLM blocks are 8 tokens)."""
LONG = [(i * 37 + 11) % 500 for i in range(44)]
"""Five fake blocks: prfaas entries at 16 and 32 tokens."""


def fake_next(ids: list[int]) -> int:  # the fake's "model", as fake_vllm.next_token
    return (sum(ids[-3:]) * 7 + 3) % 512


def fake_greedy(prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(fake_next(prompt + out))
    return out


async def until(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Gateway:
    """The gateway's control listener, reduced to recording what nodes tell it, with the real
    gateway's prefix mirror (``KVMirror``: tracked at registration, fed and acknowledged by the
    heartbeats, as ``serve/gateway/registry.py`` does)."""

    registrations: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: list[dict[str, Any]] = field(default_factory=list)
    kv: KVMirror = field(default_factory=lambda: KVMirror([SiteId("pf"), SiteId("pd")], 5.0))

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/internal/register")
        async def register(body: dict[str, Any]) -> dict[str, bool]:
            self.registrations.append(body)
            reg = Registration.model_validate(body)
            self.kv.track(reg.process, SiteId(reg.nodes[0].site))
            return {"ok": True}

        @app.post("/internal/heartbeat")
        async def heartbeat(body: dict[str, Any]) -> dict[str, Any]:
            self.heartbeats.append(body)
            beat = Heartbeat.model_validate(body)
            answer: dict[str, Any] = {"ok": True}
            if beat.prefix is not None:
                ack = self.kv.apply(beat.process, beat.prefix.to_report(), time.monotonic())
                if ack is not None:
                    answer["prefix"] = PrefixAckMsg.of(ack).model_dump()
            return answer

        return app

    def entries(self, process: str) -> dict[int, int]:
        store = self.kv.store(process)
        return {} if store is None else dict(store.entries)

    def last_link(self, process: str) -> dict[str, Any] | None:
        """The last link reading ``process`` sent (its one destination link)."""
        for beat in reversed(self.heartbeats):
            if beat["process"] == process:
                return dict(beat["links"][0]) if beat["links"] else None
        return None

    def last_report(self, node: str) -> dict[str, Any] | None:
        for beat in reversed(self.heartbeats):
            for r in beat["reports"]:
                if r["node"] == node:
                    return dict(r)
        return None


@dataclass
class Sidecar:
    host: VllmHost
    url: str
    client: httpx.AsyncClient
    server: Any

    async def prefill(self, node: str, cmd: PrefillCommand) -> PrefillOutcome:
        r = await self.client.post(f"{self.url}/nodes/{node}/prefill", json=cmd.model_dump())
        assert r.status_code == 200, r.text
        return PrefillOutcome.model_validate(r.json())

    @contextlib.asynccontextmanager
    async def decode(self, node: str, cmd: DecodeCommand) -> AsyncIterator[AsyncIterator[str]]:
        async with self.client.stream(
            "POST", f"{self.url}/nodes/{node}/decode", json=cmd.model_dump()
        ) as r:
            assert r.status_code == 200
            yield r.aiter_lines()


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def deployment(tmp_path: Path) -> Callable[..., DeploymentConfig]:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    python = tmp_path / "python"
    # The sidecar runs "PYTHON -m vllm.entrypoints.openai.api_server ARGS": drop the module.
    python.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {FAKE} "$@"\n')
    python.chmod(0o755)

    def make(control_port: int) -> DeploymentConfig:
        return DeploymentConfig.model_validate(
            {
                "engine": {
                    "kind": "vllm", "model": "tiny", "model_path": str(model),
                    "block_tokens": BLOCK,
                    "vllm": {"python": str(python), "startup_timeout_s": 20, "cpu_bind": "0"},
                },
                "gateway": {"port": 0, "control_port": control_port},
                "sites": [
                    {"name": "pf", "kind": "prfaas", "nodes": [{"name": "pf0", "role": "prefill"}]},
                    {"name": "pd", "kind": "pd", "nodes": [
                        {"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]},
                ],
                "links": [{"src": "pf", "dst": "pd", "gbps": 1}],
                "heartbeat_interval_s": 0.1,
                "psk": PSK,
            }
        )  # fmt: skip

    return make


@pytest.fixture
async def cluster(
    deployment: Callable[..., DeploymentConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, Sidecar, Sidecar, Path]]:
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    monkeypatch.setenv("FAKE_VLLM_START_DELAY_S", "0.5")
    gateway = Gateway()
    gsock = bind("127.0.0.1", 0)
    # Behind the real signature check: the sidecar verifies the MAC on every answer it gets.
    gserver = server_for(SignatureMiddleware(gateway.app(), Verifier(PSK.encode())))
    gtask = asyncio.create_task(gserver.serve(sockets=[gsock]))
    d = deployment(gsock.getsockname()[1])
    sidecars = []
    tasks = []
    for names in (["pf0"], ["p0", "d0"]):
        host = VllmHost(d, names, d.control_url)
        sock = bind("127.0.0.1", 0)
        await host.start(sock.getsockname()[1])
        server = server_for(create_node_app(host))
        tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        client = httpx.AsyncClient(auth=SignedAuth(PSK.encode()), trust_env=False, timeout=30)
        sidecars.append(Sidecar(host, url, client, server))
    try:
        yield gateway, sidecars[0], sidecars[1], record
    finally:
        pids = [s.host.server.pid for s in sidecars if s.host.server is not None]
        for s in sidecars:
            s.server.should_exit = True  # its lifespan stops the host, and so the server
            await s.client.aclose()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in sidecars:
            await s.host.stop()  # idempotent: also when the app never got to it
        gserver.should_exit = True
        await gtask
        for pid in pids:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)


def _sampling(n: int, **kw: Any) -> SamplingMsg:
    return SamplingMsg(max_new_tokens=n, **kw)


def _prefill_cmd(
    rid: str, decode_node: str, decode_port: int, cross: bool, prompt: list[int] = PROMPT
) -> PrefillCommand:
    return PrefillCommand(
        request_id=rid, tokens=pack_tokens(prompt), decode_node=decode_node,
        decode_host="127.0.0.1", decode_transfer_port=decode_port, cross_site=cross,
        receiver_cached_tokens=3, sampling=_sampling(4),
    )  # fmt: skip


def _decode_cmd(
    rid: str, prefill_node: str, n: int, prompt: list[int] = PROMPT, **kw: Any
) -> DecodeCommand:
    return DecodeCommand(
        request_id=rid, num_prompt_tokens=len(prompt), sampling=_sampling(n, **kw),
        prompt_tokens=pack_tokens(prompt), prefill_node=prefill_node, timeout_s=20,
    )  # fmt: skip


async def _ready(gateway: Gateway, *nodes: str) -> None:
    def clear() -> bool:
        reps = [gateway.last_report(n) for n in nodes]
        return all(r is not None and r["fault"] == "" for r in reps)

    await until(clear, f"{nodes} without a fault")


async def test_nodes_register_at_once_and_serve_once_vllm_answers(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    gateway, _, _, record = cluster
    regs = await until(lambda: len(gateway.registrations) >= 2 and gateway.registrations, "regs")
    nodes = {n["node"]: n for r in regs for n in r["nodes"]}
    assert set(nodes) == {"pf0", "p0", "d0"}
    assert nodes["d0"]["transfer_port"] == nodes["p0"]["transfer_port"] > 0  # one server
    await until(lambda: gateway.last_report("pf0") is not None, "a heartbeat")
    first = next(r for b in gateway.heartbeats for r in b["reports"] if r["node"] in ("p0", "d0"))
    assert first["fault"] == "vLLM server starting"  # registered before vLLM answered
    await _ready(gateway, "pf0", "p0", "d0")
    starts = [r for r in records(record) if r["kind"] == "start"]
    assert len(starts) == 2 and all(s["psk_set"] for s in starts)  # the key, by environment
    extra = {s["extra"]["listen_port"]: s["extra"] for s in starts}
    pf_extra, pd_extra = extra[nodes["pf0"]["transfer_port"]], extra[nodes["d0"]["transfer_port"]]
    assert pf_extra["pace_gbps"] == 1.0 and pd_extra["pace_gbps"] is None  # the link's own rate
    assert pf_extra["link_gbps"] == 1.0 and pd_extra["link_gbps"] is None  # its estimate's start
    assert pf_extra["kv_budget_mib"] == 1024 and pf_extra["listen_host"] == "127.0.0.1"
    report = await until(
        lambda: (r := gateway.last_report("pf0")) and r["queue_depth"] == 2 and r,
        "a report from /metrics",
    )
    assert report["batch_size"] == 0 and report["kv_capacity_bytes"] == 1 << 20
    assert report["kv_used_bytes"] == (1 << 20) // 8
    assert report["handshake_failures"] == 1
    assert pf_extra["link"] == "pf->pd"  # the destination link its reading is named after
    # The connector's own reading of its destination link, unconverted (a vLLM site's engine
    # scales neither bytes nor time): what the gateway's registry builds the LinkState of.
    pf_process = next(r["process"] for r in regs if r["nodes"][0]["node"] == "pf0")
    link = gateway.last_link(pf_process)
    assert link == {
        "link": "pf->pd", "configured_bytes_per_s": 1e9 / 8, "pace_bytes_per_s": 1e9 / 8,
        "capacity_bytes_per_s": 7e7, "basis": "measured", "backlog_bytes": 13, "rtt_s": 0.002,
        "retransmit_rate": 0.0,
    }  # fmt: skip
    assert report["egress_backlog_bytes"] == 17  # open sends' bytes not handed over (one node)
    assert "link_rtt_s" not in report  # one reading per link in the heartbeat, not per node


async def test_remote_prefill_then_decode_speak_kv_transfer_params(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    gateway, pf, pd, record = cluster
    await _ready(gateway, "pf0", "p0", "d0")
    port = pd.host.transfer_port
    lines: list[DecodeEvent] = []
    async with pd.decode("d0", _decode_cmd("r1.1", "pf0", 6)) as stream:
        ready = DecodeEvent.model_validate_json(await anext(stream))
        assert ready.kind == "ready" and ready.prefix_tokens == 0
        outcome = await pf.prefill("pf0", _prefill_cmd("r1.1", "d0", port, cross=True))
        async for line in stream:
            lines.append(DecodeEvent.model_validate_json(line))
    assert outcome.ok, outcome.error
    assert outcome.first_token == fake_next(PROMPT)
    assert outcome.kv_bytes_sent == (len(PROMPT) - 3) * 1024
    tokens = [t for e in lines for t in e.token_ids]
    assert tokens == fake_greedy(PROMPT, 6) and lines[-1].finish_reason == "length"
    done = records(record)
    pre = next(r["body"] for r in done if r["kind"] == "completion" and not r["stream"])
    assert pre["prompt"] == PROMPT and pre["max_tokens"] == 1 and pre["return_token_ids"]
    assert pre["kv_transfer_params"] == {
        "do_remote_decode": True,
        "prfaas": {"transfer_id": "r1.1", "host": "127.0.0.1", "port": port,
                   "cross_site": True, "skip_tokens": 3},
    }  # fmt: skip
    dec = next(r["body"] for r in done if r["kind"] == "completion" and r["stream"])
    assert dec["kv_transfer_params"] == {
        "do_remote_prefill": True,
        "prfaas": {"transfer_id": "r1.1", "timeout_s": 20.0},
    }
    assert dec["prompt"] == PROMPT and dec["max_tokens"] == 6 and dec["temperature"] == 0.0
    assert {"op": "wait_sent", "transfer_id": "r1.1"}.items() <= next(
        r for r in done if r["kind"] == "agent" and r["op"] == "wait_sent"
    ).items()
    report = await until(lambda: (r := gateway.last_report("pf0")) and r["egress_bytes"]
                         and r["prefilled_tokens"] and r, "egress in the report")  # fmt: skip
    assert report["egress_bytes"] == outcome.kv_bytes_sent
    # its speed for the autoscaler: the prompt's uncached tokens (the fake caches none), the
    # seconds from the request to vLLM's answer
    assert report["prefilled_tokens"] == len(PROMPT) and report["prefill_busy_s"] > 0


async def test_link_rate_re_paces_the_connector_and_a_restarted_one_again(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    gateway, pf, pd, record = cluster
    await _ready(gateway, "pf0", "p0", "d0")

    def paces() -> list[float]:
        return [
            r["gbps"] for r in records(record) if r["kind"] == "agent" and r["op"] == "set_pace"
        ]

    r = await pf.client.post(f"{pf.url}/link/rate", json={"gbps": 2.5})
    assert r.status_code == 200, r.text
    assert paces() == [2.5]  # the agent was asked, once
    await until(
        lambda: (
            (gateway.last_link(pf.host.process_name) or {}).get("configured_bytes_per_s")
            == 2.5e9 / 8
        ),
        "the new rate in the heartbeats",
    )
    r = await pd.client.post(f"{pd.url}/link/rate", json={"gbps": 2.5})
    assert r.status_code == 409 and "sends nothing across sites" in r.text
    # The server dies: a clear refusal meanwhile; restarted (at the file's pace), it is paced
    # again at the rate /link/rate set.
    server = pf.host.server
    assert server is not None and server.pid is not None
    os.killpg(server.pid, signal.SIGKILL)
    await until(lambda: not server.ready.is_set(), "the death noticed")
    r = await pf.client.post(f"{pf.url}/link/rate", json={"gbps": 4.0})
    assert r.status_code == 503 and "the vLLM server is down" in r.text, r.text
    await _ready(gateway, "pf0")
    await until(lambda: paces() == [2.5, 2.5], "the pace applied again after the restart")
    link = (await pf.host.agent.stats()).link("pf->pd")
    assert link is not None and link.pace_bytes_per_s == 2.5e9 / 8


async def test_link_rate_with_netns_is_refused_not_pretended(
    deployment: Callable[..., DeploymentConfig],
) -> None:
    """tbf shapes a namespaced deployment's link; the connector does not pace it, so no rate
    is claimed that nothing applies."""
    from prfaas.serve.node.hosting import LinkRateRefused

    d = deployment(9).model_copy(update={"netns": True})
    host = VllmHost(d, ["pf0"], d.control_url)
    argv = list(host.spec().argv)
    extra = json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    assert extra["pace_gbps"] is None and extra["link_gbps"] == 1.0  # estimated, not paced
    with pytest.raises(LinkRateRefused, match="tbf shapes the link"):
        await host.set_link_gbps(2.5)
    assert host.link_gbps == 1.0


async def test_the_whole_server_runs_on_its_cpu_bind_cores(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    # Not only vLLM's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND): the process the sidecar
    # starts, so its EngineCore and API server (children, threads) inherit the cores too.
    _, prfaas, pd, _ = cluster
    for sidecar in (prfaas, pd):
        server = sidecar.host.server
        assert server is not None and server.pid is not None
        assert os.sched_getaffinity(server.pid) == {0}


async def test_co_located_prefill_is_a_plain_decode_request(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    gateway, _, pd, record = cluster
    await _ready(gateway, "p0", "d0")

    def asked() -> int:  # calls to vLLM about requests (the sidecar's periodic stats polls aside)
        return sum(1 for r in records(record) if not (r["kind"] == "agent" and r["op"] == "stats"))

    before = asked()
    outcome = await pd.prefill("p0", _prefill_cmd("r2.1", "d0", pd.host.transfer_port, False))
    assert outcome.ok and outcome.kv_bytes_sent == 0
    assert asked() == before  # vLLM was not asked: the decode prefills itself
    stop = fake_greedy(PROMPT, 3)[2]
    async with pd.decode("d0", _decode_cmd("r2.1", "p0", 8, stop_token_ids=[stop])) as stream:
        events = [DecodeEvent.model_validate_json(line) async for line in stream]
    assert events[0].kind == "ready"
    assert [t for e in events for t in e.token_ids] == fake_greedy(PROMPT, 2)  # stop dropped
    assert events[-1].finish_reason == "stop"
    body = [r for r in records(record) if r["kind"] == "completion"][-1]["body"]
    assert "kv_transfer_params" not in body and body["stop_token_ids"] == [stop]


async def test_aborts_cancel_vllm_and_drop_the_transfer(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, pf, pd, record = cluster
    await _ready(gateway, "pf0", "p0", "d0")
    # A decode stream the gateway closes after the first tokens: the agent drops its transfer.
    cmd = _decode_cmd("r3.1", "pf0", 200, prompt=SLOW)
    async with pd.decode("d0", cmd) as stream:
        assert DecodeEvent.model_validate_json(await anext(stream)).kind == "ready"
        assert DecodeEvent.model_validate_json(await anext(stream)).kind == "tokens"
    aborted = await until(
        lambda: [r for r in records(record) if r["kind"] == "agent" and r["op"] == "abort"],
        "the agent's abort",
    )
    assert aborted[0]["transfer_id"] == "r3.1"
    await until(lambda: pd.host.nodes["d0"].idle, "d0 idle again")
    # A prefill aborted while vLLM computes: the call ends "aborted", the agent drops it.
    slow = asyncio.create_task(
        pf.prefill("pf0", _prefill_cmd("r4.1", "d0", pd.host.transfer_port, True, prompt=SLOW))
    )
    await until(lambda: not pf.host.nodes["pf0"].idle, "the prefill under way")
    r = await pf.client.post(f"{pf.url}/nodes/pf0/abort/r4.1")
    assert r.json() == {"aborted": True}
    outcome = await slow
    assert not outcome.ok and outcome.error == "aborted"
    await until(
        lambda: any(
            r["kind"] == "agent" and r["op"] == "abort" and r["transfer_id"] == "r4.1"
            for r in records(record)
        ),
        "the prefill's transfer dropped",
    )


async def test_a_killed_server_is_noticed_restarted_and_stopped_with_the_sidecar(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    gateway, pf, pd, _ = cluster
    await _ready(gateway, "pf0")
    server = pf.host.server
    assert server is not None and server.pid is not None
    old = server.pid
    os.killpg(old, signal.SIGKILL)  # the server's whole group: API server, "EngineCore"...
    await until(
        lambda: (
            "vLLM server exited (killed by SIGKILL)"
            in (gateway.last_report("pf0") or {}).get("fault", "")
        ),
        "the death in the report",
    )
    outcome = await pf.prefill("pf0", _prefill_cmd("r5.1", "d0", pd.host.transfer_port, True))
    assert not outcome.ok and "vLLM server exited" in outcome.error  # fails at once, cleanly
    await _ready(gateway, "pf0")
    assert server.num_starts == 2 and server.pid not in (None, old)
    health = (await pf.client.get(f"{pf.url}/health")).json()
    assert health["vllm"]["state"] == "ready" and health["vllm"]["starts"] == 2
    outcome = await pf.prefill("pf0", _prefill_cmd("r6.1", "d0", pd.host.transfer_port, True))
    assert outcome.ok, outcome.error
    new = server.pid
    await pf.host.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(new, 0)  # the whole group is gone


async def test_a_server_that_never_answers_is_restarted_with_the_reason(
    deployment: Callable[..., DeploymentConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_START_DELAY_S", "30")
    d = deployment(9)  # no gateway: only the server's supervision matters here
    engine = d.engine.model_copy(
        update={"vllm": d.engine.vllm.model_copy(update={"startup_timeout_s": 1.0})}
    )
    d = d.model_copy(update={"engine": engine})
    host = VllmHost(d, ["pf0"], d.control_url)
    await host.start(1)
    try:
        server = host.server
        assert server is not None
        fault = await until(lambda: "restarting" in server.fault and server.fault, "a restart")
        assert "did not answer" in fault and "within 1 s" in fault
        assert host.reports()[0].fault == fault
        first = server.num_starts
        await until(lambda: server.num_starts > first, "the next start")
    finally:
        await host.stop()
    assert host.server is not None and host.server.pid is None


def test_a_registration_with_faulty_reports_keeps_the_nodes_out_of_rotation(
    deployment: Callable[..., DeploymentConfig],
) -> None:
    """What the gateway does with the sidecar's registration: its nodes are not in rotation
    until a report without the fault (no window between registration and the first beat)."""
    from prfaas.core import MutableClusterView, SiteId, SiteKind
    from prfaas.serve.gateway.registry import NodeRegistry

    d = deployment(9)
    host = VllmHost(d, ["p0", "d0"], d.control_url)
    reg = host.registration()
    assert {r.fault for r in reg.reports} == {"vLLM server starting"}
    view = MutableClusterView({SiteId(s.name): SiteKind(s.kind) for s in d.sites}, 256)
    registry = NodeRegistry(d, view)
    registry.register(reg, 0.0)
    for node in ("p0", "d0"):
        in_rotation, why = registry.rotation(node)
        assert not in_rotation and "vLLM server starting" in why


def test_the_gateway_builds_a_vllm_sites_link_from_the_connectors_estimate(
    deployment: Callable[..., DeploymentConfig],
) -> None:
    """What the registry does with a vLLM sidecar's link fields (a vLLM deployment: the registry
    converts neither bytes nor seconds): the site's LinkState is "configured" at the file's rate
    until the connector has measured, then its estimate; the backlog is the open sends' bytes
    not handed over plus the senders' unacknowledged ones; delivered bytes grow with the
    server's cross-site bytes, piece by piece."""
    from prfaas.core import MutableClusterView, SiteId, SiteKind
    from prfaas.core.link_report import SenderLinkReport
    from prfaas.serve.gateway.registry import NodeRegistry
    from prfaas.serve.vllm.agent import AgentStats
    from prfaas.serve.vllm.host import _Snapshot

    d = deployment(9)
    host = VllmHost(d, ["pf0"], d.control_url)
    view = MutableClusterView({SiteId(s.name): SiteKind(s.kind) for s in d.sites}, 256)
    registry = NodeRegistry(d, view)
    registry.register(host.registration(), 0.0)

    def beat(at_s: float, basis: Any, estimate: float, backlog: int = 0, **stats: Any) -> Any:
        reading = SenderLinkReport("pf->pd", 1e9 / 8, 1e9 / 8, estimate, basis, backlog)
        host._snapshot = _Snapshot(stats=AgentStats(links=(reading,), **stats))
        assert registry.heartbeat(host.heartbeat(), at_s)
        return view.link(SiteId("pf"), SiteId("pd"))

    link = beat(1.0, "configured", 1e9 / 8)
    assert link.capacity_basis == "configured" and link.capacity_bytes_per_s == 1e9 / 8
    link = beat(
        2.0, "measured", 9e7, 1_000, cross_site_bytes=5_000_000, cross_site_unsent_bytes=300
    )
    assert link.capacity_basis == "measured" and link.capacity_bytes_per_s == 9e7
    assert link.backlog_bytes == 1_300
    assert link.goodput_bytes_per_s > 0  # 5 MB less the unacknowledged, delivered in 1 s


async def test_an_orphan_of_an_earlier_sidecar_is_killed_before_its_server_starts(
    deployment: Callable[..., DeploymentConfig],
) -> None:
    """A sidecar SIGKILLed leaves vLLM's EngineCore and Worker behind (only the API server dies
    with it): the next sidecar of that process finds them by their owner tag and kills them,
    and removes the private folder the dead sidecar gave them (its sockets and vLLM's)."""
    import shutil
    import subprocess
    import tempfile

    from prfaas.serve.vllm.server import OWNER_ENV, RPC_DIR_ENV, owner_tag

    d = deployment(9)
    host = VllmHost(d, ["pf0"], d.control_url)
    left, kept = (Path(tempfile.mkdtemp(prefix="prfaas-vllm-")) for _ in range(2))
    (left / "agent.sock").touch()
    env = {**os.environ, OWNER_ENV: owner_tag(host.process_name, PSK, d.control_url),
           RPC_DIR_ENV: str(left)}  # fmt: skip
    stranger = {**os.environ, OWNER_ENV: owner_tag("another-process", PSK, d.control_url),
                RPC_DIR_ENV: str(kept)}  # fmt: skip
    # the same process and key of another deployment (another gateway) on this host
    elsewhere = {**os.environ, OWNER_ENV: owner_tag(host.process_name, PSK, "http://10.9.9.9:1")}
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    orphan = subprocess.Popen(sleep, env=env, start_new_session=True)
    other = subprocess.Popen(sleep, env=stranger, start_new_session=True)
    another = subprocess.Popen(sleep, env=elsewhere, start_new_session=True)
    try:
        await host.start(1)
        await until(lambda: orphan.poll() is not None, "the orphan killed")
        assert orphan.returncode == -signal.SIGKILL
        assert not left.exists()
        # another sidecar's server, and another deployment's, are left alone
        assert other.poll() is None and another.poll() is None and kept.is_dir()
    finally:
        await host.stop()
        for folder in (left, kept):
            shutil.rmtree(folder, ignore_errors=True)
        for proc in (orphan, other, another):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


async def test_a_python_gone_since_the_file_was_read_is_a_fault_not_a_crash(
    deployment: Callable[..., DeploymentConfig], tmp_path: Path
) -> None:
    d = deployment(9)
    (tmp_path / "python").unlink()  # after validation: e.g. the venv was removed
    host = VllmHost(d, ["pf0"], d.control_url)
    await host.start(1)
    try:
        fault = await until(
            lambda: "could not be started" in host.reports()[0].fault and host.reports()[0].fault,
            "the fault",
        )
        assert "restarting in" in fault and "python" in fault
    finally:
        await host.stop()


# -- the prefix report ----------------------------------------------------------------------------
async def _fake_kv(sidecar: Sidecar, op: str, index: int = 0) -> None:
    server = sidecar.host.server
    assert server is not None
    async with httpx.AsyncClient(trust_env=False) as c:
        r = await c.post(f"{server.spec.base_url}/fake/kv", json={"op": op, "index": index})
        assert r.status_code == 200


async def _decode_all(sidecar: Sidecar, cmd: DecodeCommand) -> list[DecodeEvent]:
    async with sidecar.decode("d0", cmd) as stream:
        return [DecodeEvent.model_validate_json(line) async for line in stream]


def _long_decode(rid: str, prompt: list[int] = LONG) -> DecodeCommand:
    cmd = _decode_cmd(rid, "p0", 2, prompt=prompt)  # co-located: the PD server prefills itself
    return cmd.model_copy(update={"block_hashes": list(block_hashes(prompt, BLOCK))})


async def test_the_servers_cache_reaches_the_gateways_mirror_and_the_ready_answer(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    gateway, _, pd, record = cluster
    await _ready(gateway, "p0", "d0")
    starts = [r for r in records(record) if r["kind"] == "start"]
    assert all(s["kv_events"]["endpoint"].startswith("ipc://") for s in starts)
    assert all(s["kv_events"]["enable_kv_cache_events"] for s in starts)
    first = await _decode_all(pd, _long_decode("r7.1"))
    assert first[0].kind == "ready" and first[0].prefix_tokens == 0  # nothing cached yet
    hashes = block_hashes(LONG, BLOCK)
    want = {hashes[0]: 16, hashes[1]: 32}
    await until(lambda: gateway.entries("p0+d0") == want, "the entries in the gateway's mirror")
    assert gateway.entries("pf0") == {}  # the other site's server holds nothing
    # A prompt sharing 32 tokens: the decode node's server holds them, the prefill skips them.
    shared = [*LONG[:36], 1, 2, 3, 4, 5, 6, 7, 8]
    again = await _decode_all(pd, _long_decode("r8.1", shared))
    assert again[0].kind == "ready" and again[0].prefix_tokens == 32
    # The co-located prefill of that prompt answers with the same hit (usage, hit rates).
    co_located = _prefill_cmd("r8.1", "d0", pd.host.transfer_port, False, shared)
    co_located.block_hashes = list(block_hashes(shared, BLOCK))
    outcome = await pd.prefill("p0", co_located)
    assert outcome.ok and outcome.num_cached_tokens == 32
    health = (await pd.client.get(f"{pd.url}/health")).json()["vllm"]["prefix_report"]
    assert health["entries"] == 2 and health["lost"] == 0 and health["lifetimes"] == 1
    await until(
        lambda: pd.host.kv_events is not None and len(pd.host.kv_events.translator.journal) == 0,
        "every change acknowledged",
    )


async def test_evictions_lost_messages_junk_and_clears(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    gateway, _, pd, _ = cluster
    await _ready(gateway, "p0", "d0")
    hashes = block_hashes(LONG, BLOCK)
    events = pd.host.kv_events
    assert events is not None
    await _fake_kv(pd, "skip")  # the store's message never arrives live
    await _decode_all(pd, _long_decode("r9.1"))
    await _fake_kv(pd, "remove", 3)  # fake block 3 (tokens 24..32): the 32-token prefix goes
    await until(lambda: gateway.entries("p0+d0") == {hashes[0]: 16}, "the eviction mirrored")
    assert events.num_gaps == 1 and events.num_lost == 0  # replayed, nothing lost
    await _fake_kv(pd, "junk")
    await _decode_all(pd, _long_decode("r10.1", [9, *LONG]))  # its store is the junk message
    await until(lambda: events.num_lost == 1, "the junk counted")
    await until(lambda: gateway.entries("p0+d0") == {}, "the mirror emptied")
    await _fake_kv(pd, "clear")  # the server's cache emptied (AllBlocksCleared) ...
    await _decode_all(pd, _long_decode("r11.1"))  # ... so this stores every block again
    await until(lambda: gateway.entries("p0+d0") == {hashes[0]: 16, hashes[1]: 32}, "stored")
    await _fake_kv(pd, "clear")
    await until(lambda: gateway.entries("p0+d0") == {}, "AllBlocksCleared mirrored")


async def test_a_lost_last_message_is_fetched_after_a_silence(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    gateway, _, pd, _ = cluster
    await _ready(gateway, "p0", "d0")
    await _fake_kv(pd, "skip")  # lost, and nothing follows it to reveal the gap
    await _decode_all(pd, _long_decode("r13.1"))
    hashes = block_hashes(LONG, BLOCK)
    await until(lambda: gateway.entries("p0+d0") == {hashes[0]: 16, hashes[1]: 32},
                "the replayed store", timeout_s=20)  # fmt: skip
    assert pd.host.kv_events is not None and pd.host.kv_events.num_lost == 0


async def test_a_restarted_server_reports_from_empty_under_a_new_epoch(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    gateway, pf, _, _ = cluster
    await _ready(gateway, "pf0", "d0")
    outcome = await pf.prefill("pf0", _prefill_cmd("r12.1", "d0", 9, True, prompt=LONG))
    assert outcome.ok, outcome.error
    await until(lambda: len(gateway.entries("pf0")) == 2, "pf0's server's entries")
    mirror = gateway.kv.store("pf0")
    assert mirror is not None and pf.host.kv_events is not None
    old_epoch = mirror.epoch
    server = pf.host.server
    assert server is not None and server.pid is not None
    os.killpg(server.pid, signal.SIGKILL)
    await until(lambda: gateway.entries("pf0") == {}, "the dead server's blocks forgotten")
    await _ready(gateway, "pf0")
    await until(lambda: pf.host.kv_events is not None and
                pf.host.kv_events.num_lifetimes == 2, "the second lifetime")  # fmt: skip
    store = gateway.kv.store("pf0")
    assert store is not None and store.epoch != old_epoch and store.entries == {}


async def test_a_decode_that_recomputed_says_so_on_its_last_event(
    cluster: tuple[Gateway, Sidecar, Sidecar, Path],
) -> None:
    """The connector's load failed (the fake's RECOMPUTE_TOKEN in the prompt): vLLM's tokens are
    right, and the sidecar's finishing event says the KV sent was not used (the agent's
    ``load_result``); a load that worked says nothing."""
    gateway, _, pd, _ = cluster
    await _ready(gateway, "pf0", "p0", "d0")
    for rid, prompt, recomputed in (
        ("rc.1", [*PROMPT, RECOMPUTE_TOKEN], True),
        ("rc.2", PROMPT, False),
    ):
        lines: list[DecodeEvent] = []
        async with pd.decode("d0", _decode_cmd(rid, "pf0", 3, prompt)) as stream:
            async for line in stream:
                lines.append(DecodeEvent.model_validate_json(line))
        assert [t for e in lines for t in e.token_ids] == fake_greedy(prompt, 3), lines
        assert lines[-1].finish_reason == "length"
        assert lines[-1].kv_recomputed is recomputed, (rid, lines[-1])
        assert not any(e.kv_recomputed for e in lines[:-1])
