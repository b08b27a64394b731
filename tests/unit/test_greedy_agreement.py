"""tests/greedy_agreement.py, the property the cross-engine e2e tests assert instead of token
equality: equal up to a near tie, the parting token among the reference's top k."""

from __future__ import annotations

import math
from typing import Any

import pytest

from greedy_agreement import check_near_tie, check_vllm_answers, first_difference

pytestmark = pytest.mark.timeout(10)


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def _lps(ranked: dict[int, float]) -> Any:
    return lambda i: dict(ranked)


def test_equal_tokens_pass_without_asking_for_log_probs() -> None:
    def never(i: int) -> dict[int, float]:
        raise AssertionError("not needed")

    assert check_near_tie([4, 5, 6], [4, 5, 6], never, 0.05) is None


def test_a_near_tie_passes_and_says_where() -> None:
    lps = {7: -0.70, 9: -0.72, 3: -3.0}
    assert check_near_tie([4, 9, 1], [4, 7, 2], _lps(lps), 0.05) == 1


def test_a_clear_winner_taken_by_neither_path_fails() -> None:
    lps = {7: -0.1, 9: -2.5, 3: -3.0}  # 2.4 nats apart: a wrong cache, not rounding
    with pytest.raises(AssertionError, match="not a near tie"):
        check_near_tie([4, 9], [4, 7], _lps(lps), 0.05)


def test_a_token_outside_the_top_k_fails() -> None:
    lps = {7: -1.0, 8: -1.01, 9: -1.02, 3: -1.03}
    with pytest.raises(AssertionError, match="part at 0"):
        check_near_tie([3], [7], _lps(lps), 0.05, top_k=3)


def _choice(tokens: list[int], logprobs: list[float], tops: list[dict[int, float]]) -> Any:
    return {
        "token_ids": tokens,
        "logprobs": {
            "token_logprobs": logprobs,
            "top_logprobs": [{f"token_id:{t}": v for t, v in top.items()} for top in tops],
        },
    }


def test_vllm_answers_compare_log_probs_up_to_the_parting_token() -> None:
    ref = _choice([1, 2, 3], [-0.5, -0.69, -0.1], [{1: -0.5}, {2: -0.69, 8: -0.70}, {3: -0.1}])
    got = _choice([1, 8, 4], [-0.51, -0.68, -9.0], [{1: -0.51}, {8: -0.68}, {4: -9.0}])
    assert check_vllm_answers(got, ref, logprob_tol=0.02, tie_nats=0.05) == 1
    far = _choice([1, 8, 4], [-0.6, -0.68, -9.0], [{1: -0.6}, {8: -0.68}, {4: -9.0}])
    with pytest.raises(AssertionError):  # before the parting: log-probs 0.1 apart
        check_vllm_answers(far, ref, logprob_tol=0.02, tie_nats=0.05)
    same = _choice([1, 2, 3], [-0.5, -0.69, -0.1 - math.ulp(0.1)], [{}, {}, {}])
    assert check_vllm_answers(same, ref, logprob_tol=0.02, tie_nats=0.05) is None
