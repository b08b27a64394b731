"""Mixed engines, as an operator moving to vLLM one site at a time runs them: two live deployments
started by ``prfaas up``'s Launcher, each with one site of vLLM servers and one of prfaas torch
nodes (the same tiny fp32 llama folder at both):

- **forward**: a PrfaaS site of one vLLM prefill server (core 1), a PD site of torch nodes (one
  process per node, core 0). A long prompt's KV goes from the vLLM Worker (PrfaasConnector) to the
  torch decode node's receiver; the connector's END carries no first token (vLLM samples after the
  KV has left), so the torch node runs the last prompt token itself.
- **reverse**: a PrfaaS site of one torch prefill node (core 1), a PD site of one vLLM server for
  its prefill and decode nodes (core 0). A long prompt's KV goes from the torch node to the vLLM
  decode server's connector receiver, which installs it (its agent counts the load: installed,
  not recomputed).

Each remote request (random token ids, through the official ``openai`` client) must give the
greedy tokens of engine.torch alone on the same ids (fp32; a single vLLM server gives the same:
docs/vllm.md "Mixed sites"; two runtimes round differently, so up to a near tie:
``tests/greedy_agreement.py``), take one attempt, and cross exactly ``CacheSpec.transfer_bytes`` of
its tokens. A zeroed cache gives other tokens for every prompt used (checked here), so equal tokens
say the crossed KV was used. Short prompts stay local.

Both deployments start once for the module, side by side (``-O0``: ~40-60 s). Needs
``.venv-vllm`` and an AVX-512 CPU, else skipped with the reason. Run under the machine's vLLM
lock: ``flock /tmp/vllm.lock .venv/bin/pytest -q tests/e2e/test_vllm_mixed.py -p no:cacheprovider``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from greedy_agreement import check_against_torch
from prfaas.config import DeploymentConfig
from prfaas.serve.demo_vllm import vllm_unavailable
from prfaas.serve.launcher import Launcher, RestartPolicy
from prfaas.serve.vllm.agent import AgentClient
from prfaas.serve.vllm.server import find_orphans, owner_tag

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
THRESHOLD_TOKENS = 256
MAX_TOKENS = 16
PSK = {"forward": "vllm-mixed-forward-key-0123456789", "reverse": "vllm-mixed-reverse-key-012345"}
VLLM_PROCESS = {"forward": "pf0", "reverse": "p0+d0"}
"""The sidecar (node process) of each deployment's vLLM site: its servers carry its owner tag."""


def _skip_reason() -> str | None:
    return vllm_unavailable()  # the demo's check: no .venv-vllm, or no AVX-512


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or ""),
]


def _deployment(model: Path, which: str) -> DeploymentConfig:
    vllm_on = {"kind": "vllm", "vllm": {"cpu_bind": "1"}}  # each site on its own core
    torch_on = {"kind": "torch", "cpus": "0"}
    prfaas: dict[str, Any] = vllm_on if which == "forward" else {"kind": "torch", "cpus": "1"}
    pd: dict[str, Any] = (
        torch_on if which == "forward" else {"kind": "vllm", "vllm": {"cpu_bind": "0"}}
    )
    return DeploymentConfig.model_validate(
        {
            "engine": {
                "kind": "vllm", "model": "tiny", "model_path": str(model), "dtype": "float32",
                "vllm": {"python": str(VLLM_PY), "max_model_len": 2048, "kv_cache_space_gib": 1,
                         "startup_timeout_s": 240, "extra_args": ["-O0"]},
            },
            "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 120,
                        "heartbeat_timeout_s": 3},
            "policy": {"router": "threshold", "threshold_tokens": THRESHOLD_TOKENS},
            "heartbeat_interval_s": 0.5,
            "sites": [
                {"name": "pf", "kind": "prfaas", "hardware": "h200",
                 "nodes": [{"name": "pf0", "role": "prefill"}], "engine": prfaas},
                {"name": "pd", "kind": "pd", "hardware": "h20",
                 "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}],
                 "engine": pd},
            ],
            "links": [{"src": "pf", "dst": "pd", "gbps": 10}],
            "psk": PSK[which],
        }
    )  # fmt: skip


def _owner(which: str, launchers: dict[str, Launcher]) -> str:
    return owner_tag(VLLM_PROCESS[which], PSK[which], launchers[which].deployment.control_url)


def _kill_leftovers(launchers: dict[str, Launcher]) -> None:
    for which in VLLM_PROCESS:
        for pid in find_orphans(_owner(which, launchers)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prfaas.engine.torch.tiny import make_tiny, vllm_variant

    out = tmp_path_factory.mktemp("tiny-llama")
    overrides, dtype = vllm_variant("llama")
    make_tiny("llama", out, overrides=overrides, dtype=dtype or "float32")  # fp32: exact
    return out


@pytest.fixture(scope="module")
def live(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Launcher]]:
    """Both deployments, started side by side (each its own gateway on free ports)."""
    launchers = {
        which: Launcher(
            _deployment(model, which),
            tmp_path_factory.mktemp(f"up-{which}"),
            restart=RestartPolicy(max_deaths=3),
        )
        for which in ("forward", "reverse")
    }
    errors: dict[str, BaseException] = {}

    def start(which: str) -> None:
        try:
            launchers[which].start(ready_timeout_s=300)
        except BaseException as exc:  # re-raised below, after both have been waited for
            errors[which] = exc

    threads = [threading.Thread(target=start, args=(w,)) for w in launchers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(400)
        if errors or any(t.is_alive() for t in threads):
            raise RuntimeError(f"a deployment did not start: {errors}")
        yield launchers
    finally:
        for t in threads:
            t.join(60)  # a start still under way must end before its stop
        for launcher in launchers.values():
            launcher.stop()
        _kill_leftovers(launchers)  # whatever a failure left
    assert not any(find_orphans(_owner(w, launchers)) for w in VLLM_PROCESS), (
        "a vLLM server survived"
    )


def _prompt(seed: int, num_tokens: int) -> list[int]:
    """Random token ids, a fresh prompt per request (no prefix-cache hit anywhere)."""
    rng = random.Random(seed)
    return [rng.randrange(2, 500) for _ in range(num_tokens)]


@pytest.fixture(scope="module")
def torch_alone(model: Path) -> Callable[[list[int]], list[int]]:
    """engine.torch alone (this process, fp32): the reference tokens; asserts on the way that a
    zeroed cache of the prompt decodes to other tokens (so the crossed KV decides them)."""
    import torch

    from prfaas.engine import LayoutManifest, PrefillRequest, SamplingParams
    from prfaas.engine.torch import TorchEngine, load_model
    from prfaas.spec import DType

    torch.set_num_threads(1)
    loaded = load_model(model, DType.parse("fp32"))
    greedy = SamplingParams(max_new_tokens=MAX_TOKENS, ignore_eos=True)

    def generate(ids: list[int]) -> list[int]:
        tokens = TorchEngine(loaded).generate(PrefillRequest("ref", tuple(ids), greedy))
        zeroed = TorchEngine(loaded)
        alloc = zeroed.allocate(LayoutManifest.of("z", zeroed.layout(len(ids))), MAX_TOKENS)
        got = list(zeroed.install(alloc, -1, greedy, prompt_token_ids=tuple(ids)).token_ids)
        while zeroed.num_running:
            for event in zeroed.step():
                got.extend(event.token_ids)
        assert got != tokens, "this prompt's tokens do not depend on its KV: pick another"
        return tokens

    generate.model = loaded.model  # type: ignore[attr-defined]
    return generate


TIE_NATS = 1e-3
"""vLLM and engine.torch in fp32 round differently (log-probs ~1e-5 apart): where their greedy
tokens part, it must be at a near tie within this (``tests/greedy_agreement.py``)."""


def _agree(
    torch_alone: Callable[[list[int]], list[int]], ids: list[int], tokens: list[int]
) -> bool:
    """``tokens`` are engine.torch's own on ``ids``, up to a near tie (asserted)."""
    model = torch_alone.model  # type: ignore[attr-defined]
    check_against_torch(model, ids, tokens, torch_alone(ids), TIE_NATS)
    return True


def _complete(live: Launcher, ids: list[int], stream: bool) -> list[int]:
    """Greedy token ids through the gateway (the openai client, token ids in and out)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=180)
    extra = {"return_token_ids": True, "ignore_eos": True}
    if not stream:
        r = client.completions.create(
            model="tiny", prompt=ids, max_tokens=MAX_TOKENS, temperature=0, extra_body=extra
        )
        return list((r.choices[0].model_extra or {})["token_ids"])
    tokens: list[int] = []
    for chunk in client.completions.create(
        model="tiny", prompt=ids, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        extra_body=extra,
    ):  # fmt: skip
        for choice in chunk.choices:
            tokens += (choice.model_extra or {}).get("token_ids") or []
    return tokens


def _until(check: Callable[[], Any], what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if value := check():
                return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _route(live: Launcher, ids: list[int], stream: bool) -> tuple[list[int], dict[str, Any]]:
    before = len(live.routes())
    tokens = _complete(live, ids, stream)
    routes = _until(lambda: len(r := live.routes()) > before and r, "the request's route", 30)
    return tokens, dict(routes[-1])


def _kv_bytes_of(model: Path, num_tokens: int) -> int:
    from prfaas.engine.hf_spec import cache_map_from_config

    cfg = json.loads((model / "config.json").read_text())
    return cache_map_from_config(cfg).spec.transfer_bytes(num_tokens)


def _agent_stats(live: Launcher, node: str) -> dict[str, Any]:
    """The connector's own counters (its agent socket, found on the server's command line)."""
    ep = next(e for e in live.control.endpoints() if e["node"] == node)
    url = f"http://{ep['host']}:{ep['http_port']}/health"
    pid = int(httpx.get(url, timeout=5, trust_env=False).json()["vllm"]["pid"])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    kv_config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    agent = AgentClient(kv_config["kv_connector_extra_config"]["agent_socket"])
    stats: dict[str, Any] = asyncio.run(agent.call({"op": "stats"}, 10))
    return stats


@pytest.mark.parametrize(("seed", "num_tokens", "stream"), [(11, 300, False), (12, 1500, True)])
def test_vllm_prefill_to_a_torch_decode_node_gives_engine_torchs_tokens(
    live: dict[str, Launcher],
    model: Path,
    torch_alone: Callable[[list[int]], list[int]],
    seed: int,
    num_tokens: int,
    stream: bool,
) -> None:
    ids = _prompt(seed, num_tokens)
    tokens, route = _route(live["forward"], ids, stream)
    assert route["offloaded"] and route["prefill_node"] == "pf0", route
    assert route["decode_node"] == "d0" and route["attempts"] == 1, route
    assert route["kv_bytes"] == _kv_bytes_of(model, num_tokens), route
    assert len(tokens) == MAX_TOKENS and _agree(torch_alone, ids, tokens)


@pytest.mark.parametrize(("seed", "num_tokens", "stream"), [(21, 300, True), (22, 700, False)])
def test_torch_prefill_to_a_vllm_decode_server_installs_and_gives_the_same_tokens(
    live: dict[str, Launcher],
    model: Path,
    torch_alone: Callable[[list[int]], list[int]],
    seed: int,
    num_tokens: int,
    stream: bool,
) -> None:
    ids = _prompt(seed, num_tokens)
    before = _agent_stats(live["reverse"], "d0")
    tokens, route = _route(live["reverse"], ids, stream)
    after = _agent_stats(live["reverse"], "d0")
    assert route["offloaded"] and route["prefill_node"] == "pf0", route
    assert route["decode_node"] == "d0" and route["attempts"] == 1, route
    assert route["kv_bytes"] == _kv_bytes_of(model, num_tokens), route
    # Installed from the crossed KV, not recomputed (the decode server's fallback gives the same
    # tokens, so the tokens alone could not tell).
    assert after["sessions_received"] - before["sessions_received"] == 1, (before, after)
    assert after["loads_ok"] - before["loads_ok"] == 1, (before, after)
    assert after["loads_failed"] == before["loads_failed"], (before, after)
    assert len(tokens) == MAX_TOKENS and _agree(torch_alone, ids, tokens)


@pytest.mark.parametrize("which", ["forward", "reverse"])
def test_a_short_prompt_stays_local(
    live: dict[str, Launcher], torch_alone: Callable[[list[int]], list[int]], which: str
) -> None:
    ids = _prompt(31, 40)
    tokens, route = _route(live[which], ids, stream=True)
    assert not route["offloaded"] and route["prefill_node"] == "p0", route
    assert route["attempts"] == 1 and _agree(torch_alone, ids, tokens)
