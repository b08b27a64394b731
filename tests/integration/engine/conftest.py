"""Shared tiny models for the engine.torch tests: made once per session, loaded once per dtype.

Prompts are 3 blocks of 64 tokens plus a partial block; 32 tokens are generated; EOS is ignored
(random weights emit it at random). Exact-token comparisons are like with like: same model, same
dtype, only the path (batching, processes, transfer, prefix cache) differs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engine_helpers import ARCHS, EXTRA_ARCHS, GREEDY, prompt  # noqa: E402

from prfaas.engine import PrefillRequest, SamplingParams  # noqa: E402
from prfaas.engine.torch import LoadedModel, TorchEngine, load_model  # noqa: E402
from prfaas.engine.torch.tiny import make_tiny  # noqa: E402
from prfaas.spec import DType  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: make_tiny(arch, root / arch) for arch in (*ARCHS, *EXTRA_ARCHS)}


@pytest.fixture(scope="session")
def loaded(model_dirs: dict[str, Path]) -> Callable[[str, str], LoadedModel]:
    cache: dict[tuple[str, str], LoadedModel] = {}

    def get(arch: str, dtype: str) -> LoadedModel:
        key = (arch, dtype)
        if key not in cache:
            cache[key] = load_model(model_dirs[arch], DType.parse(dtype))
        return cache[key]

    return get


@pytest.fixture(scope="session")
def reference(loaded: Callable[[str, str], LoadedModel]) -> Callable[..., list[int]]:
    """(a) one-process generation, alone: the tokens every other path must reproduce."""
    cache: dict[tuple[str, str, int, SamplingParams], list[int]] = {}

    def get(arch: str, dtype: str, seed: int = 0, sampling: SamplingParams = GREEDY) -> list[int]:
        key = (arch, dtype, seed, sampling)
        if key not in cache:
            engine = TorchEngine(loaded(arch, dtype))
            cache[key] = engine.generate(PrefillRequest("ref", prompt(seed), sampling))
        return cache[key]

    return get
