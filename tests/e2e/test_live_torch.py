"""A live two-site deployment of a real (tiny, random-weight) Qwen3-Next hybrid model on PyTorch,
routed by the bandwidth-aware ``prfaas`` policy: the tokens a client receives are identical whether
the request was prefilled at the PrfaaS site or at PD-P, with or without a prefix hit, with the
prefix moved across sites first (both directions), and identical to single-process generation."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import launched, routes

from prfaas.config import DeploymentConfig
from prfaas.serve.launcher import Launcher

# Torch models, CPU-bound, nothing timed: the back stream of `make test`.
pytestmark = [pytest.mark.timeout(300), pytest.mark.behind]

BLOCK = 64
THRESHOLD = 100
MAX_TOKENS = 24
_ALLOWED = sorted(os.sched_getaffinity(0))
CORES = {"prfaas": _ALLOWED[-1], "pd": _ALLOWED[0]}
"""Each site's ``engine.cpus`` (one core each where there are two)."""


def _deployment(model_dir: Path) -> DeploymentConfig:
    return DeploymentConfig.model_validate(
        {
            "engine": {
                "kind": "torch", "model": "tiny-qwen3-next", "model_path": str(model_dir),
                "block_tokens": BLOCK, "checkpoint_every_blocks": 1,
            },
            "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 120},
            "policy": {"router": "prfaas", "threshold_tokens": THRESHOLD},
            "sites": [
                {"name": "prfaas", "kind": "prfaas", "hardware": "h200",
                 "engine": {"cpus": str(CORES["prfaas"])},
                 "nodes": [{"name": "pf0", "role": "prefill"}]},
                {"name": "pd", "kind": "pd", "hardware": "h20",
                 "engine": {"cpus": str(CORES["pd"])},
                 "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]},
            ],
            "links": [{"src": "prfaas", "dst": "pd", "gbps": 100}],
            "psk": "test-key-0123456789abcdef",
        }
    )  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prfaas.engine.torch.tiny import make_tiny

    return make_tiny("qwen3_next", tmp_path_factory.mktemp("tiny") / "qwen3_next")


@pytest.fixture(scope="module")
def live(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    with launched(_deployment(model_dir), tmp_path_factory.mktemp("live")) as launcher:
        yield launcher


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Any:
    """Single-process greedy generation with the same engine code, in this process."""
    import torch

    from prfaas.engine import PrefillRequest, SamplingParams
    from prfaas.engine.torch import TorchEngine

    torch.set_num_threads(1)
    engine = TorchEngine.from_folder(model_dir)
    count = iter(range(10**6))

    def generate(prompt: list[int]) -> list[int]:
        sampling = SamplingParams(max_new_tokens=MAX_TOKENS)
        req = PrefillRequest(f"ref-{next(count)}", tuple(prompt), sampling)
        return engine.generate(req)

    generate.cache_spec = engine.cache_spec  # type: ignore[attr-defined]
    return generate


def _served(live: Launcher, prompt: list[int]) -> tuple[list[int], str, dict[str, Any]]:
    body = {
        "model": "tiny-qwen3-next", "prompt": prompt, "max_tokens": MAX_TOKENS,
        "temperature": 0, "return_token_ids": True,
    }  # fmt: skip
    r = httpx.post(f"{live.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    route = next(x for x in routes(live) if x["request_id"] == r.json()["id"])
    return list(choice["token_ids"]), choice["finish_reason"], route


def _expected(reference_tokens: list[int], finish: str) -> list[int]:
    # The client does not see a stop token (EOS); single-process generation includes it.
    return reference_tokens[:-1] if finish == "stop" else reference_tokens


def _prompt(seed: int, length: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 400 + 50 for i in range(length)]


def test_remote_prefill_then_prefix_moved_home(live: Launcher, reference: Any) -> None:
    long = _prompt(1, 3 * BLOCK + 37)  # 3 blocks and a partial one: > t, offloaded
    tokens, finish, route = _served(live, long)
    assert route["prefill_site"] == "prfaas" and route["num_cached_tokens"] == 0
    assert tokens == _expected(reference(long), finish)
    # Shares 3 blocks with the first prompt, cached at the PrfaaS site: only 41 tokens are new,
    # <= t, so PD-P prefills it after pulling the 3-block prefix home (a cross-site cache move).
    again = long[: 3 * BLOCK] + _prompt(9, 41)
    tokens, finish, route = _served(live, again)
    assert route["prefill_site"] == "pd" and route["moved_tokens"] == 3 * BLOCK
    assert route["num_cached_tokens"] == 3 * BLOCK
    assert tokens == _expected(reference(again), finish)


def test_local_prefill_then_prefix_moved_to_prfaas(live: Launcher, reference: Any) -> None:
    short = _prompt(2, BLOCK + 20)  # <= t: PD-P
    tokens, finish, route = _served(live, short)
    assert route["prefill_site"] == "pd" and route["num_cached_tokens"] == 0
    assert tokens == _expected(reference(short), finish)
    longer = short[:BLOCK] + _prompt(3, 90)  # 90 new tokens <= t: PD-P, reusing its own block
    tokens, finish, route = _served(live, longer)
    assert route["prefill_site"] == "pd" and route["num_cached_tokens"] == BLOCK
    assert route["moved_tokens"] == 0
    assert tokens == _expected(reference(longer), finish)
    # 150 new tokens > t: offloaded, and the home block goes to the PrfaaS site first.
    longest = short[:BLOCK] + _prompt(4, 150)
    tokens, finish, route = _served(live, longest)
    assert route["prefill_site"] == "prfaas" and route["moved_tokens"] == BLOCK
    assert route["num_cached_tokens"] == BLOCK
    # torch nodes run one per process, so the decode node's own store is empty: all of it crossed.
    assert route["kv_bytes"] == reference.cache_spec.bytes_for(len(longest))
    assert tokens == _expected(reference(longest), finish)


def test_each_node_process_runs_on_its_sites_cores(live: Launcher) -> None:
    for node, site in (("pf0", "prfaas"), ("p0", "pd"), ("d0", "pd")):
        pid = live.child(node).proc.pid
        assert os.sched_getaffinity(pid) == {CORES[site]}, node
        # every thread too (torch's and the engine's, started after the pin)
        for tid in os.listdir(f"/proc/{pid}/task"):
            assert os.sched_getaffinity(int(tid)) == {CORES[site]}, (node, tid)
