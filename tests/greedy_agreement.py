"""What two numeric paths' greedy tokens must have in common, as a property rather than equality.

Two paths that compute the same model with different kernels (bf16 in vLLM and in engine.torch,
a recurrent step against a chunked prefill, vLLM against engine.torch) round differently. Where a
position's two best tokens are within that rounding of each other, either path may take either,
and from there the continuations have different contexts: token equality is then a coin toss
(seen: a tiny random Qwen3-Next's tokens parted at index 12 of 16 on one machine, not on another).
What does hold, and what these helpers assert:

- the tokens agree up to the first position where they differ, if any;
- at that position the other path's token is among the reference's ``top_k`` at that position,
  with a log-prob within ``tie_nats`` of the reference's own token (a near tie, not a wrong cache:
  a zeroed or misplaced cache moves log-probs by whole nats);
- (vLLM answers) each token's log-prob agrees within ``logprob_tol`` up to and including it.

Like-with-like comparisons in fp32 on one runtime may stay exact; these are for the others. Needs
no vLLM; ``torch_next_logprobs`` imports torch when called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

TOP_K = 5


def first_difference(got: Sequence[int], ref: Sequence[int]) -> int | None:
    """The first index where the two differ (a shorter one differs at its end), None if equal."""
    for i, (a, b) in enumerate(zip(got, ref, strict=False)):
        if a != b:
            return i
    return None if len(got) == len(ref) else min(len(got), len(ref))


def check_near_tie(
    got: Sequence[int],
    ref: Sequence[int],
    ref_logprobs_at: Callable[[int], dict[int, float]],
    tie_nats: float,
    top_k: int = TOP_K,
) -> int | None:
    """Asserts the property above; ``ref_logprobs_at(i)``: the reference path's log-probs at
    position ``i`` (token id -> log-prob, at least its ``top_k``). Returns where they part."""
    assert len(got) == len(ref), (got, ref)
    d = first_difference(got, ref)
    if d is None:
        return None
    lps = ref_logprobs_at(d)
    top = sorted(lps, key=lambda t: -lps[t])[:top_k]
    where = f"tokens part at {d}: {got[d]} against the reference's {ref[d]}"
    assert got[d] in top, (where, {t: lps[t] for t in top})
    gap = lps.get(ref[d], float("-inf")) - lps[got[d]]
    assert gap <= tie_nats, (where, f"not a near tie: {gap:.4f} nats apart")
    return d


def torch_next_logprobs(model: Any, prefix: Sequence[int], top_k: int = TOP_K) -> dict[int, float]:
    """One plain forward of a Hugging Face model over ``prefix`` (no cache): the next token's
    ``top_k`` log-probs, computed in fp32 from the model's logits."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([list(prefix)], dtype=torch.long, device=model.device)
        logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()
    lps = torch.log_softmax(logits, dim=-1)
    values, indices = lps.topk(top_k)
    return {int(i): float(v) for i, v in zip(indices, values, strict=True)}


def check_against_torch(
    model: Any,
    prompt: Sequence[int],
    got: Sequence[int],
    ref: Sequence[int],
    tie_nats: float,
    top_k: int = TOP_K,
) -> int | None:
    """``ref``: engine.torch's greedy tokens after ``prompt``; ``got``: another path's. The
    reference's log-probs at the parting position come from ``model`` itself."""

    def at(i: int) -> dict[int, float]:
        lps = torch_next_logprobs(model, [*prompt, *ref[:i]], max(top_k, 2))
        if got[i] not in lps:  # outside the top k: the check fails on membership, say its value
            lps[got[i]] = float("-inf")
        return lps

    return check_near_tie(got, ref, at, tie_nats, top_k)


def vllm_logprobs(choice: Any) -> list[dict[int, float]]:
    """Per position, token id -> log-prob of a vLLM completion choice asked with ``logprobs=k``
    and ``return_tokens_as_token_ids`` (its tokens spelled ``token_id:N``)."""
    out = []
    for top in choice["logprobs"]["top_logprobs"]:
        items = (top or {}).items()  # None where vLLM has none for a position
        out.append({int(k.removeprefix("token_id:")): float(v) for k, v in items})
    return out


def check_vllm_answers(
    got: Any, ref: Any, logprob_tol: float, tie_nats: float, top_k: int = TOP_K
) -> int | None:
    """Two vLLM completion choices for the same prompt (``logprobs >= top_k``, token ids): the
    property above, with each token's log-prob within ``logprob_tol`` of the reference's up to and
    including the parting position. Returns where they part (None: not at all)."""
    g, r = list(got["token_ids"]), list(ref["token_ids"])
    ref_tops = vllm_logprobs(ref)

    def at(i: int) -> dict[int, float]:
        lps = dict(ref_tops[i])
        lps.setdefault(g[i], float("-inf"))  # not in the reference's top k: fails membership
        return lps

    d = check_near_tie(g, r, at, tie_nats, top_k)
    end = len(g) if d is None else d + 1
    lp_got = got["logprobs"]["token_logprobs"][:end]
    lp_ref = ref["logprobs"]["token_logprobs"][:end]
    for i, (a, b) in enumerate(zip(lp_got, lp_ref, strict=True)):
        assert abs(a - b) <= logprob_tol, (i, a, b, g, r)
    return d
