"""``PrefillMeter``: a prefill node's tokens and busy seconds, overlapping prefills counted once,
an interval still open counted up to now, a failed prefill's time counted without its tokens."""

from __future__ import annotations

import pytest

from prfaas.serve.node.prefill_meter import PrefillMeter

pytestmark = pytest.mark.timeout(30)


def test_overlapping_prefills_count_their_union_once() -> None:
    m = PrefillMeter()
    assert m.busy_s(5.0) == 0.0 and m.prefilled_tokens == 0
    m.started(10.0)
    m.started(11.0)  # overlaps the first
    assert m.busy_s(11.5) == pytest.approx(1.5)  # open interval counted up to now
    m.ended(12.0, 1_000)
    m.ended(13.0, 3_000)
    assert m.busy_s(20.0) == pytest.approx(3.0)  # 10-13, not 2 + 2
    m.started(20.0)
    m.ended(21.0, 0)  # failed: its time was spent, no tokens came of it
    assert (m.prefilled_tokens, m.busy_s(30.0)) == (4_000, pytest.approx(4.0))


def test_an_end_without_a_start_is_a_bug() -> None:
    with pytest.raises(RuntimeError, match="never started"):
        PrefillMeter().ended(1.0, 10)
