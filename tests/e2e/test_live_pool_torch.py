"""A pool whose node group runs a real model (``kind: torch``, a tiny random-weight Qwen3-Next
made by the project) and a tenant whose PD site runs the same model on torch: a long prompt is
prefilled at the pool node, its KV and recurrent state streamed straight to the tenant's decode
node, and the tokens the client gets equal single-process generation; a short one stays local and
equals it too."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import routes
from pool_helpers import KEYS, LivePool, live_pool

from prfaas.config import load_deployment
from prfaas.serve.launcher import Launcher

pytestmark = pytest.mark.timeout(300)
BLOCK = 64
THRESHOLD = 100
MAX_TOKENS = 12
CORE = sorted(os.sched_getaffinity(0))[0]


def _pool_file(model: Path) -> str:
    return f"""
version: 1
units: {{time_scale: 0.1, byte_divisor: 1000, block_tokens: {BLOCK}}}
front_door: {{host: 127.0.0.1, port: 0, control_port: 0}}
egress_gbps: 100
heartbeat_interval_s: 0.5
lease_s: 30.0
groups:
  - {{name: g-tiny, model: tiny-qwen3-next, kind: torch, model_path: {model}, hardware: h200,
     num_nodes: 1}}
tenants:
  - {{name: tenant-a, keys: [{{id: a-1, env: PRFAAS_POOL_KEY_A}}]}}
"""


def _tenant_file(model: Path, url: str) -> str:
    return f"""
engine: {{kind: torch, model: tiny-qwen3-next, model_path: {model}, block_tokens: {BLOCK},
          checkpoint_every_blocks: 1}}
gateway: {{port: 0, control_port: 0, request_timeout_s: 120}}
policy: {{router: threshold, threshold_tokens: {THRESHOLD}}}
sites:
  - name: pd
    kind: pd
    hardware: h20
    engine: {{cpus: "{CORE}"}}
    nodes: [{{name: p0, role: prefill}}, {{name: d0, role: decode}}]
pool:
  url: {url}
  tenant: tenant-a
  key: {{id: a-1, env: PRFAAS_POOL_KEY_A}}
  link: {{gbps: 100, rtt_ms: 0}}
  tuner: fixed
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prfaas.engine.torch.tiny import make_tiny

    return make_tiny("qwen3_next", tmp_path_factory.mktemp("tiny") / "qwen3_next")


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Any:
    """Single-process greedy generation with the same engine code, in this process."""
    import torch

    from prfaas.engine import PrefillRequest, SamplingParams
    from prfaas.engine.torch import TorchEngine

    torch.set_num_threads(1)
    engine = TorchEngine.from_folder(model_dir)

    def generate(prompt: list[int]) -> list[int]:
        sampling = SamplingParams(max_new_tokens=MAX_TOKENS)
        return engine.generate(PrefillRequest(f"ref-{len(prompt)}", tuple(prompt), sampling))

    return generate


@pytest.fixture(scope="module")
def tenant(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Launcher, LivePool]]:
    tmp = tmp_path_factory.mktemp("pool_torch")
    old = {k: os.environ.get(k) for k in KEYS}
    os.environ.update(KEYS)  # the tenant's processes read its key from the environment
    try:
        with live_pool(tmp, ready_timeout_s=120, pool_text=_pool_file(model_dir)) as pool:
            path = tmp / "tenant.yaml"
            path.write_text(_tenant_file(model_dir, pool.url))
            live = Launcher(load_deployment(path), tmp / "tenant-wd")
            try:
                live.start(ready_timeout_s=120)
                deadline = time.monotonic() + 60
                while not any(n["node"] == "pool" and n.get("in_rotation") for n in live.nodes()):
                    assert time.monotonic() < deadline, "the pool never came into rotation"
                    time.sleep(0.2)
                yield live, pool
            except BaseException:
                print(pool.log_tail())
                raise
            finally:
                live.stop()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _served(live: Launcher, prompt: list[int]) -> tuple[list[int], str, dict[str, Any]]:
    body = {"model": "tiny-qwen3-next", "prompt": prompt, "max_tokens": MAX_TOKENS,
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


def test_a_pool_torch_node_prefills_and_the_tenant_decodes_the_same_tokens(
    tenant: tuple[Launcher, LivePool], reference: Any
) -> None:
    live, pool = tenant
    long = _prompt(1, 5 * BLOCK + 17)
    tokens, finish, route = _served(live, long)
    if not route["offloaded"]:
        said = [ln for ln in live.child("gateway").log_tail(200).splitlines()
                if "pool" in ln.lower()]  # fmt: skip
        print(route, "\n".join(said[-20:]), pool.log_tail(), sep="\n")
    assert route["offloaded"] and route["prefill_site"] == "pool", route
    assert route["decode_node"] == "d0", route  # (a pool route does not carry its KV bytes)
    assert tokens == _expected(reference(long), finish)
    short = _prompt(2, 40)
    tokens, finish, route = _served(live, short)
    assert not route["offloaded"] and route["prefill_node"] == "p0", route
    assert tokens == _expected(reference(short), finish)
