"""Constants and helpers shared by the engine.torch tests (fixtures live in conftest.py)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch

from prfaas.engine import SamplingParams
from prfaas.engine.torch import LoadedModel, TorchEngine
from prfaas.spec import DType

ARCHS = ("qwen3_next", "kimi_linear", "bamba", "mistral", "llama")
EXTRA_ARCHS = ("nemotron_h",)
DTYPES = ("fp32", "bf16")
BLOCK = 64
PROMPT_TOKENS = 3 * BLOCK + 37
NEW_TOKENS = 32
GREEDY = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)


def prompt(seed: int = 0, num_tokens: int = PROMPT_TOKENS) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(2, 500) for _ in range(num_tokens))


def decode_all(engine: TorchEngine, tokens: dict[str, list[int]]) -> None:
    """Step until nothing runs, appending every event's tokens."""
    for _ in range(10 * NEW_TOKENS):
        if not engine.num_running:
            return
        for ev in engine.step():
            tokens[ev.request_id].extend(ev.token_ids)
    raise AssertionError("decode did not finish")


def assert_greedy_tokens(
    model: LoadedModel, prompt_ids: Sequence[int], got: list[int], expected: list[int], what: str
) -> None:
    """``got`` (some path) must be ``expected`` (one-process generation), token for token.

    One exception, in bf16 only: greedy argmax over an exact tie. Random tiny models have logits
    around 0.4, where one bf16 step is 0.002, so two tokens often tie exactly, and which one wins
    depends on the GEMM kernel's last bits: on an AVX512-BF16 CPU (an EPYC), oneDNN gave a request
    other bits when it joined a batch (tokens 148 vs 89, both at logit 0.4102). So from the first
    difference on, every token of ``got`` must be the argmax, within two bf16 steps, of a full
    forward over the prompt and ``got``'s earlier tokens: a path that corrupts the cache still fails
    (its tokens are nowhere near the top), a tie broken the other way passes."""
    if got == expected:
        return
    assert len(got) == len(expected), f"{what}: {len(got)} tokens, expected {len(expected)}"
    assert model.cmap.dtype is DType.BF16, f"{what}: {got} != {expected}"
    first = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
    for i in range(first, len(got)):
        ids = torch.tensor([[*prompt_ids, *got[:i]]], dtype=torch.long)
        with torch.inference_mode():
            logits = model.model(input_ids=ids).logits[0, -1].float()
        top = float(logits.max())
        tie = 2 * 2.0 ** (math.floor(math.log2(abs(top) or 1.0)) - 7)  # 2 steps of a bf16 at top
        assert float(logits[got[i]]) >= top - tie, (
            f"{what}: token {i} is {got[i]} (logit {float(logits[got[i]]):.4f}), "
            f"not a greedy choice (max {top:.4f}); expected {expected}"
        )
