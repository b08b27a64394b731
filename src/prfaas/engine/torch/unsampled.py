"""An installed cache whose first token the sender did not sample (a vLLM prefill server samples
after its KV has left): the cache as it was before the last prompt token, and that token, for the
engine to run as a decode step (``TorchEngine.install`` with ``first_token < 0``).

Owns only that rewind and its refusals; the engine joins the result to the batch. Never imports
the engine, no asyncio.
"""

from __future__ import annotations

from collections.abc import Sequence

from prfaas.engine.errors import EngineError
from prfaas.engine.torch import hf_cache
from prfaas.spec import CacheLayout


def before_last_token(
    cache: hf_cache.RequestCache,
    layout: CacheLayout,
    prompt_token_ids: Sequence[int],
    request_id: str,
) -> tuple[hf_cache.RequestCache, int]:
    """An installed cache whose first token the sender did not sample (END carried none: a vLLM
    prefill server samples after its KV has left), as the cache before the last prompt token and
    that token, to run as a decode step. A cache of the whole prompt loses its last row (only
    full-attention layers can: a state or a window cannot be rewound); one of all but the last
    token (a hybrid vLLM server sends the states before it) is taken as it is."""
    n, m = len(prompt_token_ids), cache.num_tokens
    if n == 0:
        raise EngineError(f"request {request_id}: the KV came without a first token and no prompt")
    if m == n - 1:
        return cache, int(prompt_token_ids[-1])
    if m != n:
        raise EngineError(
            f"request {request_id}: the KV covers {m} tokens of a {n}-token prompt "
            "and came without a first token"
        )
    fixed = [seg.kind.value for seg in layout.segments if not seg.kind.grows_with_length]
    if fixed:
        raise EngineError(
            f"request {request_id}: the KV came without a first token and covers the whole "
            f"prompt; this model's {fixed[0]} layers cannot drop the last token to recompute it"
        )
    # Attention tensors are [1, heads, tokens, dim]: drop the last token's row.
    layers = [{name: t[..., : m - 1, :] for name, t in layer.items()} for layer in cache.layers]
    return hf_cache.RequestCache(m - 1, layers), int(prompt_token_ids[-1])
