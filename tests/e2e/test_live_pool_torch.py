"""A pool of two torch node groups serving two real models (tiny random-weight Qwen3-Next and
fp32 llama, made by the project), shared by two tenants, each serving one of them on its own torch
PD site: a long prompt is prefilled at the pool node of the tenant's model, its KV (and the
recurrent state, for Qwen3-Next) streamed straight to the tenant's decode node, and the tokens the
client gets equal single-process generation, for each tenant; a short one stays local and equals it
too."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import routes
from pool_helpers import KEYS, LivePool, live_pool

from prfaas.config import load_deployment
from prfaas.serve.launcher import Launcher

# Torch models, CPU-bound, nothing timed: the back stream of `make test`.
pytestmark = [pytest.mark.timeout(300), pytest.mark.behind]
BLOCK = 64
THRESHOLD = 100
MAX_TOKENS = 12
CORES = sorted(os.sched_getaffinity(0))
TENANTS = {  # tenant -> (architecture, served model name, its key's id and variable)
    "tenant-a": ("qwen3_next", "tiny-qwen3-next", "a-1", "PRFAAS_POOL_KEY_A"),
    "tenant-b": ("llama", "tiny-llama", "b-1", "PRFAAS_POOL_KEY_B"),
}


def _pool_file(models: dict[str, Path]) -> str:
    groups = "".join(
        f"""  - {{name: g-{arch.replace("_", "-")}, model: {name}, kind: torch,
     model_path: {models[tenant]}, hardware: h200, num_nodes: 1}}
"""
        for tenant, (arch, name, _, _) in TENANTS.items()
    )
    tenants = "".join(
        f"  - {{name: {tenant}, keys: [{{id: {kid}, env: {env}}}]}}\n"
        for tenant, (_, _, kid, env) in TENANTS.items()
    )
    return f"""
version: 1
units: {{time_scale: 0.1, byte_divisor: 1000, block_tokens: {BLOCK}}}
front_door: {{host: 127.0.0.1, port: 0, control_port: 0}}
egress_gbps: 100
heartbeat_interval_s: 0.5
lease_s: 30.0
groups:
{groups}tenants:
{tenants}"""


def _tenant_file(tenant: str, model: Path, url: str, core: int) -> str:
    _, name, kid, env = TENANTS[tenant]
    return f"""
engine: {{kind: torch, model: {name}, model_path: {model}, block_tokens: {BLOCK},
          checkpoint_every_blocks: 1}}
gateway: {{port: 0, control_port: 0, request_timeout_s: 120}}
policy: {{router: threshold, threshold_tokens: {THRESHOLD}}}
sites:
  - name: pd
    kind: pd
    hardware: h20
    engine: {{cpus: "{core}"}}
    nodes: [{{name: p0, role: prefill}}, {{name: d0, role: decode}}]
pool:
  url: {url}
  tenant: {tenant}
  key: {{id: {kid}, env: {env}}}
  link: {{gbps: 100, rtt_ms: 0}}
  tuner: fixed
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from prfaas.engine.torch.tiny import make_tiny

    root = tmp_path_factory.mktemp("tiny")
    return {tenant: make_tiny(arch, root / arch) for tenant, (arch, *_) in TENANTS.items()}


@pytest.fixture(scope="module")
def reference(models: dict[str, Path]) -> Any:
    """Single-process greedy generation with the same engine code, in this process."""
    import torch

    from prfaas.engine import PrefillRequest, SamplingParams
    from prfaas.engine.torch import TorchEngine

    torch.set_num_threads(1)
    engines = {tenant: TorchEngine.from_folder(path) for tenant, path in models.items()}

    def generate(tenant: str, prompt: list[int]) -> list[int]:
        sampling = SamplingParams(max_new_tokens=MAX_TOKENS)
        request = PrefillRequest(f"ref-{len(prompt)}", tuple(prompt), sampling)
        return engines[tenant].generate(request)

    return generate


@pytest.fixture(scope="module")
def tenants(
    models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, Launcher], LivePool]]:
    tmp = tmp_path_factory.mktemp("pool_torch")
    old = {k: os.environ.get(k) for k in KEYS}
    os.environ.update(KEYS)  # the tenants' processes read their keys from the environment
    try:
        with (
            live_pool(tmp, ready_timeout_s=120, pool_text=_pool_file(models)) as pool,
            ExitStack() as stack,
        ):
            lives: dict[str, Launcher] = {}
            try:
                for i, tenant in enumerate(TENANTS):
                    path = tmp / f"{tenant}.yaml"
                    core = CORES[i % len(CORES)]
                    path.write_text(_tenant_file(tenant, models[tenant], pool.url, core))
                    live = Launcher(load_deployment(path), tmp / f"{tenant}-wd")
                    stack.callback(live.stop)
                    live.start(ready_timeout_s=120)
                    lives[tenant] = live
                deadline = time.monotonic() + 60
                for live in lives.values():
                    while not any(n["node"] == "pool" and n.get("in_rotation")
                                  for n in live.nodes()):  # fmt: skip
                        assert time.monotonic() < deadline, "the pool never came into rotation"
                        time.sleep(0.2)
                yield lives, pool
            except BaseException:
                print(pool.log_tail())
                raise
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _served(live: Launcher, model: str, prompt: list[int]) -> tuple[list[int], str, dict[str, Any]]:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": 0, "return_token_ids": True}  # fmt: skip
    r = httpx.post(f"{live.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    route = next(x for x in routes(live) if x["request_id"] == r.json()["id"])
    return list(choice["token_ids"]), choice["finish_reason"], route


def _expected(tokens: list[int], finish: str) -> list[int]:
    return tokens[:-1] if finish == "stop" else tokens  # the client sees no EOS


def _prompt(seed: int, length: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 400 + 50 for i in range(length)]


@pytest.mark.parametrize("tenant", list(TENANTS))
def test_a_pool_torch_node_prefills_and_each_tenant_decodes_the_same_tokens(
    tenants: tuple[dict[str, Launcher], LivePool], reference: Any, tenant: str
) -> None:
    lives, pool = tenants
    live, model = lives[tenant], TENANTS[tenant][1]
    long = _prompt(1, 5 * BLOCK + 17)
    tokens, finish, route = _served(live, model, long)
    if not route["offloaded"]:
        said = [ln for ln in live.child("gateway").log_tail(200).splitlines()
                if "pool" in ln.lower()]  # fmt: skip
        print(route, "\n".join(said[-20:]), pool.log_tail(), sep="\n")
    assert route["offloaded"] and route["prefill_site"] == "pool", route
    assert route["decode_node"] == "d0", route
    assert route["kv_bytes"] > 0, route  # the pool's outcome carries its node's KV bytes back
    assert tokens == _expected(reference(tenant, long), finish)
    short = _prompt(2, 40)
    tokens, finish, route = _served(live, model, short)
    assert not route["offloaded"] and route["prefill_node"] == "p0", route
    assert tokens == _expected(reference(tenant, short), finish)
