"""engine.torch sampling on hand-made logits: greedy below 1e-5 (never NaN), any seed, top_k,
min_tokens, repetition_penalty (exactly transformers' processor), and the parameter checks."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from transformers.generation.logits_process import (  # noqa: E402
    RepetitionPenaltyLogitsProcessor,
)

from prfaas.engine import SamplingParams  # noqa: E402
from prfaas.engine.torch.sampling import (  # noqa: E402
    SamplingError,
    choose,
    processed_logits,
    seen_mask,
)

VOCAB = 50


def _logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed))


def _draws(logits: torch.Tensor, params: SamplingParams, n: int = 200) -> set[int]:
    return {choose(logits, params, i) for i in range(n)}


@pytest.mark.parametrize("temperature", [0.0, 1e-40, 1e-6, 9.9e-6])
def test_a_tiny_temperature_is_greedy(temperature: float) -> None:
    logits = _logits() * 1e4  # large logits: dividing by 1e-40 would give inf - inf = NaN
    params = SamplingParams(temperature=temperature, top_p=0.5, top_k=5)
    assert _draws(logits, params, 20) == {int(torch.argmax(logits))}


def test_a_small_real_temperature_still_samples_without_nan() -> None:
    params = SamplingParams(temperature=1e-5, seed=3)
    assert choose(_logits() * 1e4, params, 0) == int(torch.argmax(_logits()))
    assert len(_draws(_logits(), SamplingParams(temperature=1.0, seed=3))) > 5


@pytest.mark.parametrize("seed", [10**30, -(10**30), 2**63 - 1, 2**64, -1])
def test_any_seed_is_accepted_and_reproducible(seed: int) -> None:
    params = SamplingParams(temperature=1.0, seed=seed)
    first = [choose(_logits(), params, i) for i in range(20)]
    assert first == [choose(_logits(), params, i) for i in range(20)]
    assert len(set(first)) > 3  # a real draw, not a constant


def test_top_k_keeps_the_k_most_likely() -> None:
    logits = _logits(1)
    top3 = set(torch.topk(logits, 3).indices.tolist())
    assert _draws(logits, SamplingParams(temperature=5.0, top_k=1)) == {int(torch.argmax(logits))}
    drawn = _draws(logits, SamplingParams(temperature=5.0, top_k=3))
    assert drawn == top3  # hot enough that 200 draws reach all three
    for off in (-1, 0, VOCAB + 10):
        assert len(_draws(logits, SamplingParams(temperature=5.0, top_k=off))) > 3


def test_min_tokens_masks_stop_ids_until_reached() -> None:
    logits = _logits(2)
    eos = int(torch.argmax(logits))
    params = SamplingParams(max_new_tokens=8, min_tokens=3)
    stops = frozenset({eos, 49})
    assert eos not in [choose(logits, params, i, stops) for i in range(3)]
    assert choose(logits, params, 3, stops) == eos  # from the 4th token on it may stop
    assert choose(logits, SamplingParams(max_new_tokens=8), 0, stops) == eos
    everything = frozenset(range(VOCAB))
    with pytest.raises(SamplingError, match="no finite logit"):
        choose(logits, params, 0, everything)


@pytest.mark.parametrize("penalty", [1.3, 0.7, 2.0])
def test_repetition_penalty_is_transformers_processor(penalty: float) -> None:
    logits = _logits(3)
    history = [4, 4, 9, 17, 31, 9]
    params = SamplingParams(repetition_penalty=penalty)
    got = processed_logits(logits, params, 0, seen=seen_mask(VOCAB, history))
    want = RepetitionPenaltyLogitsProcessor(penalty)(
        torch.tensor([history]), logits.unsqueeze(0).clone()
    )[0]
    assert torch.equal(got, want)


def test_repetition_penalty_changes_the_greedy_choice() -> None:
    logits = torch.tensor([2.0, 1.5, -1.0, -0.5, -0.6])
    params = SamplingParams(repetition_penalty=2.0)
    assert choose(logits, params, 0, seen=seen_mask(5, [0])) == 1  # 2.0 -> 1.0 < 1.5
    negative = torch.tensor([-3.0, -0.5, -0.6])
    assert choose(negative, params, 0, seen=seen_mask(3, [1])) == 2  # -0.5 -> -1.0 < -0.6
    assert choose(logits, SamplingParams(), 0, seen=seen_mask(5, [0])) == 0  # 1.0: off


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", -2),
        ("min_tokens", -1),
        ("min_tokens", 17),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", math.inf),
        ("temperature", math.nan),
    ],
)
def test_parameters_the_engine_cannot_honour_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(max_new_tokens=16, **{field: value})  # type: ignore[arg-type]
