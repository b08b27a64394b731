"""Choosing the next token of one request, in vLLM's order of logits processing.

repetition penalty (Hugging Face semantics, over the prompt and the output so far) -> min_tokens
(EOS and stop ids masked until that many tokens exist) -> greedy when ``temperature`` is below
``GREEDY_BELOW_TEMPERATURE`` -> temperature -> top-k -> top-p -> one draw.

Each token draws from its own generator seeded by ``(seed, index of the token)``: the same seed
gives the same tokens wherever the request is prefilled or decoded and whatever batch it shares.
Any seed works: the mix is reduced to the 64 bits ``torch.Generator.manual_seed`` accepts.
Nothing here can produce NaN probabilities: a temperature small enough to overflow the division
is greedy, and logits with nothing finite left raise ``SamplingError`` (the request fails alone).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from prfaas.engine.api import SamplingParams
from prfaas.engine.errors import EngineError

GREEDY_BELOW_TEMPERATURE = 1e-5
"""As vLLM: a temperature under this is greedy (dividing by it would overflow to inf/NaN)."""
_SEED_STRIDE = 1_000_003
_SEED_SPACE = 1 << 64  # manual_seed takes [-2**63, 2**64): reduce into [0, 2**64)


class SamplingError(EngineError):
    """The logits leave nothing to choose from (all masked or not finite)."""


def seen_mask(vocab_size: int, token_ids: Iterable[int]) -> torch.Tensor:
    """``bool [vocab]``: which ids appeared (the repetition penalty's prompt + output set)."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    ids = [t for t in token_ids if 0 <= t < vocab_size]
    if ids:
        mask[torch.tensor(ids, dtype=torch.long)] = True
    return mask


def generator_seed(seed: int, token_index: int) -> int:
    return (seed * _SEED_STRIDE + token_index) % _SEED_SPACE


def processed_logits(
    logits: torch.Tensor,
    params: SamplingParams,
    token_index: int,
    stop_ids: frozenset[int] = frozenset(),
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logits [vocab]`` (fp32, CPU) after the repetition penalty and the min_tokens mask."""
    logits = logits.detach().float().cpu()
    if params.repetition_penalty != 1.0 and seen is not None:
        # HF's RepetitionPenaltyLogitsProcessor: shrink seen tokens' logits towards 0 (or push
        # negative ones further down), so a penalty > 1 always makes a seen token less likely.
        penalty = params.repetition_penalty
        penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
        logits = torch.where(seen, penalised, logits)
    if token_index < params.min_tokens and stop_ids:
        masked = [t for t in stop_ids if 0 <= t < logits.shape[-1]]
        if masked:
            logits = logits.clone()
            logits[torch.tensor(masked, dtype=torch.long)] = -torch.inf
    if not bool(torch.isfinite(logits).any()):
        raise SamplingError(
            f"token {token_index}: no finite logit left to choose from (min_tokens masking or a "
            "model output of inf/NaN)"
        )
    return logits


def choose(
    logits: torch.Tensor,
    params: SamplingParams,
    token_index: int,
    stop_ids: frozenset[int] = frozenset(),
    seen: torch.Tensor | None = None,
) -> int:
    """The token for ``logits [vocab]``. ``token_index`` counts generated tokens from 0;
    ``stop_ids`` (EOS unless ignored, plus the request's stop ids) are masked while
    ``token_index < params.min_tokens``; ``seen`` (``bool [vocab]``) is penalised when
    ``params.repetition_penalty != 1``."""
    logits = processed_logits(logits, params, token_index, stop_ids, seen)
    if params.temperature < GREEDY_BELOW_TEMPERATURE:
        return int(torch.argmax(logits).item())
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep a token if the mass before it is below top_p (the top token is always kept).
        keep = (cumulative - sorted_probs) < params.top_p
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    gen = torch.Generator().manual_seed(generator_seed(params.seed, token_index))
    return int(torch.multinomial(probs, 1, generator=gen).item())
