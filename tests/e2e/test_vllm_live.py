"""A live two-site deployment of real vLLM (CPU) servers run by ``prfaas up``'s Launcher: a PrfaaS
site of one vLLM prefill node (its server pinned to core 1) and a PD site of one process whose
prefill and decode nodes share one server (core 0); the threshold router sends a long prompt to
the PrfaaS site (its KV crosses through PrfaasConnector) and a short one to the PD site's own
server (co-located). Through the official ``openai`` client, streaming and not:

- the same prompt gives the same greedy tokens through the remote route and the local route, and
  the route log says which route each request took;
- the PrfaaS site's vLLM server killed (its process group) while a request waits on it: the
  request completes through local prefill, the sidecar restarts vLLM and the node comes back
  into rotation (then takes long prompts again);
- the servers' prefix caches reach the gateway's mirror (their KV cache events through the
  sidecars' heartbeats): after a remote prefill both sites hold the prompt's 512-token blocks, a
  longer prompt sharing them goes remote with only its new tokens' KV crossing (the decode
  node's "ready" says what its server holds), and one sharing them with a short new part stays
  local (the threshold counts only the uncached tokens at home).

Servers start once for the module (``-O0``: no compilation, ~20 s). Needs ``.venv-vllm`` and an
AVX-512 CPU, else skipped with the reason. Run under the machine's vLLM lock:
``flock /tmp/vllm.lock .venv/bin/pytest -q -x tests/e2e/test_vllm_live.py -p no:cacheprovider``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prfaas.config import DeploymentConfig
from prfaas.serve.demo_vllm import vllm_unavailable
from prfaas.serve.gateway.decision_log import read_decision_log
from prfaas.serve.launcher import Launcher, RestartPolicy
from prfaas.serve.vllm.server import find_orphans, owner_tag

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
PSK = "vllm-live-test-key-0123456789"
THRESHOLD_TOKENS = 256
MAX_TOKENS = 12
CHUNK_TOKENS = 512
"""Each server schedules at most this many tokens per step: the long prompt takes several."""
PROCESSES = ("pf0", "p0+d0")
"""The launcher's node processes (one per site): their sidecars' names."""
BLOCK_TOKENS = 512
"""The deployment's prefix-cache block (``engine.block_tokens``' default)."""


def _skip_reason() -> str | None:
    return vllm_unavailable()  # the demo's check: no .venv-vllm, or no AVX-512


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or ""),
]


def _deployment(model: Path, decision_log: Path) -> DeploymentConfig:
    return DeploymentConfig.model_validate(
        {
            "engine": {
                "kind": "vllm", "model": "tiny", "model_path": str(model), "dtype": "float32",
                "vllm": {"python": str(VLLM_PY), "max_model_len": 2048, "kv_cache_space_gib": 1,
                         "startup_timeout_s": 240,
                         "extra_args": ["-O0", "--max-num-batched-tokens", str(CHUNK_TOKENS)]},
            },
            "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 120,
                        "heartbeat_timeout_s": 3, "decision_log": str(decision_log)},
            "policy": {"router": "threshold", "threshold_tokens": THRESHOLD_TOKENS},
            "heartbeat_interval_s": 0.5,
            "sites": [
                {"name": "pf", "kind": "prfaas", "hardware": "h200",
                 "nodes": [{"name": "pf0", "role": "prefill"}],
                 "engine": {"vllm": {"cpu_bind": "1"}}},
                {"name": "pd", "kind": "pd", "hardware": "h20",
                 "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}],
                 "engine": {"vllm": {"cpu_bind": "0"}}},
            ],
            "links": [{"src": "pf", "dst": "pd", "gbps": 10}],
            "psk": PSK,
        }
    )  # fmt: skip


def _owner(process: str, launcher: Launcher) -> str:
    return owner_tag(process, PSK, launcher.deployment.control_url)


def _kill_leftovers(launcher: Launcher) -> None:
    for process in PROCESSES:
        for pid in find_orphans(_owner(process, launcher)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prfaas.engine.torch.tiny import make_tiny, vllm_variant

    out = tmp_path_factory.mktemp("tiny-llama")
    overrides, dtype = vllm_variant("llama")
    make_tiny("llama", out, overrides=overrides, **({"dtype": dtype} if dtype else {}))
    return out


@pytest.fixture(scope="module")
def live(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    work = tmp_path_factory.mktemp("up")
    launcher = Launcher(
        _deployment(model, work / "decisions.jsonl"), work, restart=RestartPolicy(max_deaths=3)
    )
    try:
        launcher.start(ready_timeout_s=300)
        yield launcher
    finally:
        launcher.stop()
        _kill_leftovers(launcher)  # whatever a failure left (a SIGSTOPped server, say)
    assert not any(find_orphans(_owner(p, launcher)) for p in PROCESSES), "a vLLM server survived"


@pytest.fixture(scope="module")
def long_prompt(model: Path) -> str:
    """Over 1,500 tokens: prefilled in 4 chunks of CHUNK_TOKENS at the PrfaaS site."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while"]
    text = " ".join(words[(i * 7) % len(words)] for i in range(550))
    assert 1500 <= len(tok.encode(text)) < 2048 - MAX_TOKENS and len(tok.encode(text)) > 3 * 512
    return text


@pytest.fixture(scope="module")
def prompts(model: Path) -> tuple[str, str]:
    """A long prompt (over the threshold: remote) and a short one (local)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while"]
    long = " ".join(words[i % len(words)] for i in range(150))
    short = " ".join(words[:10])
    n_long, n_short = len(tok.encode(long)), len(tok.encode(short))
    # Under one prefix-cache block: the servers' prefix reports never make it short at home, so
    # each test routes it by its length alone however often it was sent before.
    assert THRESHOLD_TOKENS < n_long < BLOCK_TOKENS and n_short < THRESHOLD_TOKENS
    return long, short


def _client(live: Launcher) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=180)


def _complete(live: Launcher, prompt: str, stream: bool) -> list[int]:
    """Greedy token ids of ``prompt`` through the gateway (the openai client, token ids asked)."""
    client = _client(live)
    extra = {"return_token_ids": True}
    if not stream:
        r = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, extra_body=extra
        )
        return list(r.choices[0].model_extra["token_ids"])
    tokens: list[int] = []
    for chunk in client.completions.create(
        model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        extra_body=extra,
    ):  # fmt: skip
        for choice in chunk.choices:
            tokens += (choice.model_extra or {}).get("token_ids") or []
    return tokens


def _last_route(live: Launcher, before: int) -> dict[str, Any]:
    routes = _until(lambda: len(r := live.routes()) > before and r, "the request's route", 30)
    return dict(routes[-1])


def _until(check: Callable[[], Any], what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if value := check():
                return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _vllm_of(live: Launcher, node: str) -> dict[str, Any]:
    """The sidecar's account of its vLLM server (``/health``: state, pid, starts)."""
    ep = next(e for e in live.control.endpoints() if e["node"] == node)
    r = httpx.get(f"http://{ep['host']}:{ep['http_port']}/health", timeout=5, trust_env=False)
    return dict(r.json()["vllm"])


def test_remote_and_local_routes_give_the_same_greedy_tokens(
    live: Launcher, prompts: tuple[str, str]
) -> None:
    long, short = prompts
    seen: dict[tuple[str, bool], list[int]] = {}
    for stream in (False, True):
        before = len(live.routes())
        seen["remote", stream] = _complete(live, long, stream)
        route = _last_route(live, before)
        assert route["offloaded"] and route["prefill_node"] == "pf0", route
        assert route["decode_node"] == "d0" and route["kv_bytes"] > 0, route
    live.control.drain("pf0")  # the same prompt, now prefilled by the PD site's own server
    try:
        for stream in (False, True):
            before = len(live.routes())
            seen["local", stream] = _complete(live, long, stream)
            route = _last_route(live, before)
            assert not route["offloaded"] and route["prefill_node"] == "p0", route
    finally:
        live.control.resume("pf0")
    reference = seen["remote", False]
    assert len(reference) == MAX_TOKENS
    assert all(tokens == reference for tokens in seen.values()), seen
    before = len(live.routes())
    assert len(_complete(live, short, stream=True)) == MAX_TOKENS
    route = _last_route(live, before)
    assert not route["offloaded"] and route["prefill_node"] == "p0" and route["kv_bytes"] == 0


def test_a_long_chunked_prompt_remote_matches_local(live: Launcher, long_prompt: str) -> None:
    before = len(live.routes())
    remote = _complete(live, long_prompt, stream=True)
    route = _last_route(live, before)
    assert route["offloaded"] and route["prefill_node"] == "pf0" and route["kv_bytes"] > 0, route
    live.control.drain("pf0")
    try:
        before = len(live.routes())
        local = _complete(live, long_prompt, stream=False)
        route = _last_route(live, before)
        assert not route["offloaded"] and route["prefill_node"] == "p0", route
    finally:
        live.control.resume("pf0")
    assert len(remote) == MAX_TOKENS and remote == local


def test_a_clients_seed_on_a_long_sampled_prompt_harms_no_cpu_server(
    live: Launcher, long_prompt: str
) -> None:
    """vLLM's CPU build kills its engine on a seeded sampled prompt prefilled in chunks (here 4
    of CHUNK_TOKENS; docs/vllm.md, Seeds), and every request it holds with it: the sidecars
    leave such a seed out, so the request completes at its first attempt on both routes and no
    server restarts."""
    client = _client(live)
    starts = {n: _vllm_of(live, n)["starts"] for n in ("pf0", "d0")}

    def sampled(first_word: str) -> dict[str, Any]:
        # a prompt of its own: no server holds its prefix, so it is prefilled whole, in chunks
        assert long_prompt.startswith("the ")
        prompt = first_word + long_prompt[3:]
        before = len(live.routes())
        r = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=1.0, seed=1234,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert r.usage.completion_tokens == MAX_TOKENS
        return _last_route(live, before)

    route = sampled("dog")
    assert route["offloaded"] and route["attempts"] == 1, route
    live.control.drain("pf0")  # the PD site's own server prefills it, in chunks
    try:
        route = sampled("fox")
    finally:
        live.control.resume("pf0")
    assert not route["offloaded"] and route["attempts"] == 1, route
    time.sleep(2)  # a dead server is noticed within the sidecar's 1 s look
    assert {n: _vllm_of(live, n)["starts"] for n in starts} == starts


def test_a_killed_prfaas_server_mid_request_completes_locally_and_comes_back(
    live: Launcher, prompts: tuple[str, str]
) -> None:
    long, _ = prompts
    live.wait_nodes(60, ["pf0"])
    server = _vllm_of(live, "pf0")
    assert server["state"] == "ready" and server["pid"]
    pgid, starts = int(server["pid"]), int(server["starts"])
    # Hold the server still so the request is surely waiting on it, then kill its whole group.
    os.killpg(pgid, signal.SIGSTOP)
    result: dict[str, Any] = {}

    def request() -> None:
        try:
            result["tokens"] = _complete(live, long, stream=True)
        except Exception as exc:
            result["error"] = exc

    before = len(live.routes())
    worker = threading.Thread(target=request)
    worker.start()
    try:
        _until(
            lambda: any(n["node"] == "pf0" and n["in_flight"] > 0 for n in live.nodes()),
            "the request at pf0",
            30,
        )
    finally:
        os.killpg(pgid, signal.SIGKILL)
    worker.join(180)
    assert not worker.is_alive() and "error" not in result, result
    assert len(result["tokens"]) == MAX_TOKENS
    route = _last_route(live, before)
    assert route["attempts"] == 2 and not route["offloaded"] and route["prefill_node"] == "p0"
    # The sidecar noticed, restarted vLLM, and the node is back in rotation. Counted from the
    # starts before the kill, not from 1: a server that needed a second start when the module
    # began (one CI run) already counts 2, and the old, dead one still reads "ready" until the
    # sidecar's next look (a local completion can take under its 1 s).
    back = _until(
        lambda: (s := _vllm_of(live, "pf0"))["starts"] > starts and s["state"] == "ready" and s,
        "pf0's server restarted",
        300,
    )
    assert back["pid"] != pgid
    live.wait_nodes(60, ["pf0"])
    before = len(live.routes())
    assert len(_complete(live, long, stream=False)) == MAX_TOKENS
    route = _last_route(live, before)
    assert route["offloaded"] and route["prefill_node"] == "pf0", route


def _prefix_report(live: Launcher, node: str) -> dict[str, Any]:
    """The sidecar's account of its server's prefix report (``/health``)."""
    report = _vllm_of(live, node)["prefix_report"]
    assert report is not None, "no KV cache events subscribed"
    return dict(report)


def test_the_servers_prefix_caches_reach_the_gateway_and_count(live: Launcher, model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    words = [
        "river",
        "stone",
        "cloud",
        "maple",
        "quiet",
        "amber",
        "seven",
        "north",
        "glass",
        "ember",
    ]
    base = " ".join(words[(i * 3) % len(words)] for i in range(330))  # ~1,190 tokens: 2 blocks
    longer = base + " " + " ".join(words[(i * 7) % len(words)] for i in range(110))
    nearly = base + " over the lazy dog"
    ids = [tok.encode(p) for p in (base, longer, nearly)]
    assert all(i[: 2 * BLOCK_TOKENS] == ids[0][: 2 * BLOCK_TOKENS] for i in ids)
    assert 2 * BLOCK_TOKENS < len(ids[0]) < 3 * BLOCK_TOKENS and len(ids[1]) < 2048 - MAX_TOKENS
    assert len(ids[1]) - 2 * BLOCK_TOKENS > THRESHOLD_TOKENS >= len(ids[2]) - 2 * BLOCK_TOKENS
    live.wait_nodes(60, ["pf0", "p0", "d0"])
    before = {n: _prefix_report(live, n)["entries"] for n in ("pf0", "d0")}

    # 1. Nothing of it cached anywhere: remote, every token's KV crosses.
    n_routes = len(live.routes())
    _complete(live, base, stream=False)
    first = _last_route(live, n_routes)
    assert first["offloaded"] and first["prefill_node"] == "pf0", first
    # Both servers now hold its two blocks (the decode server caches what it installed), and
    # the gateway has applied every change of both reports.
    for node in ("pf0", "d0"):

        def mirrored(node: str = node) -> bool:
            r = _prefix_report(live, node)
            return bool(r["entries"] >= before[node] + 2 and r["unacknowledged"] == 0)

        _until(mirrored, f"{node}'s server's blocks in the gateway's mirror", 30)
        assert _prefix_report(live, node)["lost"] == 0

    # 2. Sharing those 1,024 tokens, with more than the threshold new: remote, and the decode
    # node's "ready" said its server holds 1,024, so only the rest's KV crossed.
    n_routes = len(live.routes())
    _complete(live, longer, stream=True)
    second = _last_route(live, n_routes)
    assert second["offloaded"] and second["prefill_node"] == "pf0", second
    n1, n2 = first["num_prompt_tokens"], second["num_prompt_tokens"]
    assert second["kv_bytes"] * n1 == first["kv_bytes"] * (n2 - 2 * BLOCK_TOKENS), (first, second)
    assert second["num_cached_tokens"] >= 2 * BLOCK_TOKENS  # pf0's vLLM reused its own cache
    routes = [r for r in read_decision_log(live.deployment.gateway.decision_log or "")
              if r["kind"] == "route" and r["request"]["num_prompt_tokens"] == n2]  # fmt: skip
    assert routes and routes[-1]["request"]["cached_tokens_by_site"] == {
        "pf": 2 * BLOCK_TOKENS, "pd": 2 * BLOCK_TOKENS,
    }, routes[-1]["request"]  # fmt: skip
    assert routes[-1]["decision"]["num_cached_tokens"] == 2 * BLOCK_TOKENS

    # 3. Sharing them with only a few new tokens: uncached at home under the threshold, local.
    n_routes = len(live.routes())
    assert len(_complete(live, nearly, stream=False)) == MAX_TOKENS
    third = _last_route(live, n_routes)
    assert not third["offloaded"] and third["prefill_node"] == "p0", third


def test_the_gateway_measures_the_vllm_sites_link_after_link_rate(
    live: Launcher, model: Path
) -> None:
    """``POST /link/rate`` on the PrfaaS site's sidecar re-paces its server's connector (the
    agent's ``set_pace``) at 8 Mbit/s; a fresh ~1,750-token prompt's KV (3.6 MB, ~3.6 s: several
    spans of 0.5 s, sampled every 0.25 s, that the pacer held back throughout, even when a busy
    machine delays a sample; at 16 Mbit/s one CI run measured none) then crosses paced, and the
    gateway's link state for the site says "measured", near the pace: the connector's own
    estimate, through the sidecar's reports and the registry. Runs last: it leaves the link
    slow."""
    from transformers import AutoTokenizer

    from prfaas.serve.auth import SignedAuth

    gbps = 0.008
    pace = gbps * 1e9 / 8  # a vLLM deployment's modelled bytes/s are real bytes per wall second
    live.wait_nodes(60, ["pf0", "p0", "d0"])
    (link,) = live.control.control()["links"]
    assert link["capacity_basis"] == "configured" and link["capacity_bytes_per_s"] == 10e9 / 8
    ep = next(e for e in live.control.endpoints() if e["node"] == "pf0")
    r = httpx.post(
        f"http://{ep['host']}:{ep['http_port']}/link/rate", json={"gbps": gbps},
        auth=SignedAuth(PSK.encode()), timeout=10, trust_env=False,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    tok = AutoTokenizer.from_pretrained(str(model))
    words = ["violet", "harbor", "copper", "meadow", "lantern", "orbit", "saffron", "tundra"]
    prompt = " ".join(words[(i * 5 + i // 8) % len(words)] for i in range(400))
    assert 1200 < len(tok.encode(prompt)) < 2048 - MAX_TOKENS
    before = len(live.routes())
    assert len(_complete(live, prompt, stream=True)) == MAX_TOKENS
    route = _last_route(live, before)
    assert route["offloaded"] and route["kv_bytes"] > pace, route  # over 1 s of KV at the pace

    last: list[dict[str, Any]] = []

    def measured() -> dict[str, Any] | None:
        (state,) = live.control.control()["links"]
        last[:] = [dict(state)]
        return dict(state) if state["capacity_basis"] == "measured" else None

    try:
        state = _until(measured, "the link measured at the gateway", 15)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its last state: {last}") from None
    assert 0.6 * pace <= state["capacity_bytes_per_s"] <= pace, (state, pace)


def test_the_decode_node_reports_its_servers_steps(live: Launcher) -> None:
    """A vLLM site's decode node reports its server's engine steps (``vllm:iteration_tokens_total``
    's count), as a torch decode node reports its own: ``prfaas profile --plumbing-of`` splits
    the relay's per-step cost by them."""
    live.wait_nodes(60, ["pf0", "p0", "d0"])

    def steps() -> int:
        return sum(int(r["decode_steps"]) for r in live.nodes() if r["node"] == "d0")

    before = steps()
    assert len(_complete(live, "count the steps of this short answer", stream=False)) == MAX_TOKENS
    # Each token past the first is a step of its own (one request decoding); the report lags a
    # heartbeat and a poll of the server's /metrics.
    _until(lambda: steps() >= before + MAX_TOKENS - 1, "the steps in d0's report", 30)
    assert all(r["decode_steps"] == 0 for r in live.nodes() if r["role"] == "prefill")


def test_each_sidecar_runs_on_its_servers_cores(live: Launcher) -> None:
    """A vLLM site's sidecar pins itself to its server's ``cpu_bind`` cores (the simulator
    charges the sidecar's terms there); unpinned, it went wherever the kernel put it."""
    for site, core in (("pf", 1), ("pd", 0)):
        sidecar = live.child(site).proc.pid
        assert os.sched_getaffinity(sidecar) == {core}, site
        tasks = os.listdir(f"/proc/{sidecar}/task")  # every thread, not only the main one
        assert all(os.sched_getaffinity(int(t)) == {core} for t in tasks), site
