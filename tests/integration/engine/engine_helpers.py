"""Constants and helpers shared by the engine.torch tests (fixtures live in conftest.py)."""

from __future__ import annotations

import random

from prfaas.engine import SamplingParams
from prfaas.engine.torch import TorchEngine

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
