"""Choosing the next token: greedy, or seeded temperature + top-p sampling.

Each token draws from its own generator seeded by ``(seed, index of the token)``: the same seed
gives the same tokens wherever the request is prefilled or decoded and whatever batch it shares.
"""

from __future__ import annotations

import torch

from prfaas.engine.api import SamplingParams

_SEED_STRIDE = 1_000_003


def choose(logits: torch.Tensor, params: SamplingParams, token_index: int) -> int:
    """The token for ``logits [vocab]``; ``token_index`` counts generated tokens from 0."""
    logits = logits.detach().float().cpu()
    if params.temperature == 0.0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep a token if the mass before it is below top_p (the top token is always kept).
        keep = (cumulative - sorted_probs) < params.top_p
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    gen = torch.Generator().manual_seed(params.seed * _SEED_STRIDE + token_index)
    return int(torch.multinomial(probs, 1, generator=gen).item())
