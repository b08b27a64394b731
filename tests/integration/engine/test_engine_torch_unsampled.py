"""engine.torch installing KV whose first token the sender did not sample (``first_token`` -1, what
a vLLM prefill server's END carries: vLLM samples after the KV has left). The decode engine runs
the last prompt token itself, as vLLM's decode server does: from a cache of the whole prompt
without its last row (full attention only), or from a cache of all but the last token (a hybrid
vLLM server sends the states before it). The tokens must be one-process generation's. It used to
relay -1 as the first token (the gateway answered 500) and then decode from it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from engine_helpers import (
    GREEDY,
    NEW_TOKENS,
    PROMPT_TOKENS,
    assert_greedy_tokens,
    decode_all,
    prompt,
)

from prfaas.engine import Allocation, EngineError, LayerOutput, LayoutManifest, PrefillRequest
from prfaas.engine.torch import LoadedModel, TorchEngine

Loaded = Callable[[str, str], LoadedModel]
Reference = Callable[..., list[int]]


def _sent(model: LoadedModel, token_ids: tuple[int, ...]) -> tuple[LayerOutput, ...]:
    """What a sender's session holds for ``token_ids``: their whole cache, layer by layer."""
    sender = TorchEngine(model)
    sender.prefill(PrefillRequest("s", token_ids, GREEDY))
    return sender.export("s")


def _received(
    decoder: TorchEngine, rid: str, outputs: tuple[LayerOutput, ...], num_tokens: int
) -> Allocation:
    alloc = decoder.allocate(LayoutManifest.of(rid, decoder.layout(num_tokens)), NEW_TOKENS)
    for out, buf in zip(outputs, alloc.layer_buffers, strict=True):
        for offset, view in out.pieces():
            buf[offset : offset + view.nbytes] = view
    return alloc


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_whole_prompt_cache_without_a_first_token_decodes_as_one_process(
    dtype: str, loaded: Loaded, reference: Reference
) -> None:
    model = loaded("llama", dtype)
    decoder = TorchEngine(model)
    alloc = _received(decoder, "r", _sent(model, prompt(0)), PROMPT_TOKENS)
    event = decoder.install(alloc, -1, GREEDY, prompt_token_ids=prompt(0))
    assert event.token_ids == () and event.finish_reason is None  # the first comes with a step
    tokens: dict[str, list[int]] = {"r": list(event.token_ids)}
    decode_all(decoder, tokens)
    assert len(tokens["r"]) == NEW_TOKENS
    assert_greedy_tokens(model, prompt(0), tokens["r"], reference("llama", dtype), "unsampled")
    assert decoder.budget.used_bytes == 0


@pytest.mark.timeout(120)
def test_a_hybrid_cache_one_token_short_decodes_as_one_process(
    loaded: Loaded, reference: Reference
) -> None:
    model = loaded("qwen3_next", "fp32")
    decoder = TorchEngine(model)
    short = prompt(0)[:-1]
    alloc = _received(decoder, "h", _sent(model, short), PROMPT_TOKENS - 1)
    tokens = {"h": list(decoder.install(alloc, -1, GREEDY, prompt_token_ids=prompt(0)).token_ids)}
    decode_all(decoder, tokens)
    assert_greedy_tokens(model, prompt(0), tokens["h"], reference("qwen3_next", "fp32"), "hybrid")


@pytest.mark.timeout(120)
def test_what_cannot_be_recomputed_is_refused_and_released(loaded: Loaded) -> None:
    hybrid = loaded("qwen3_next", "fp32")
    decoder = TorchEngine(hybrid)
    alloc = _received(decoder, "w", _sent(hybrid, prompt(0)), PROMPT_TOKENS)
    with pytest.raises(EngineError, match="cannot drop the last token"):
        decoder.install(alloc, -1, GREEDY, prompt_token_ids=prompt(0))  # states past the prompt
    dense = TorchEngine(loaded("llama", "fp32"))
    outputs = _sent(loaded("llama", "fp32"), prompt(0))
    alloc = _received(dense, "n", outputs, PROMPT_TOKENS)
    with pytest.raises(EngineError, match="no prompt"):
        dense.install(alloc, -1, GREEDY)
    alloc = _received(dense, "m", outputs, PROMPT_TOKENS)
    with pytest.raises(
        EngineError, match=f"covers {PROMPT_TOKENS} tokens of a {PROMPT_TOKENS + 2}-token"
    ):
        dense.install(alloc, -1, GREEDY, prompt_token_ids=prompt(0, PROMPT_TOKENS + 2))
    assert decoder.budget.used_bytes == 0 and dense.budget.used_bytes == 0
    assert decoder.num_running == 0 and dense.num_running == 0
