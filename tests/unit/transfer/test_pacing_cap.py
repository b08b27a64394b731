"""``pacing.CappedPacer``: a destination link's bucket under the process's egress cap. Pure: the
times are the buckets' arithmetic, nothing sleeps."""

from __future__ import annotations

import pytest

from prfaas.transfer.pacing import CappedPacer, TokenBucket

pytestmark = pytest.mark.timeout(30)
BURST = 100.0


def test_links_under_one_cap_wait_for_the_cap_when_together_they_exceed_it() -> None:
    cap = TokenBucket(1000.0, BURST, 0.0)
    a = CappedPacer(TokenBucket(1000.0, BURST, 0.0), cap, 0.0)
    b = CappedPacer(TokenBucket(1000.0, BURST, 0.0), cap, 0.0)
    assert a.rate_bytes_per_s == 1000.0
    assert a.reserve(1100, 0.0) == pytest.approx(1.0)  # its own pace and the cap agree
    # b's own link is idle (1 s of its pace would do), but the cap carries a's bytes too.
    assert b.reserve(1100, 0.0) == pytest.approx(2.1)
    assert b.throttled_s(1.0) == pytest.approx(1.0) and b.throttled_s(5.0) == pytest.approx(2.1)
    assert a.throttled_s(5.0) == pytest.approx(1.0)  # each counts the waits it was made


def test_the_slower_of_pace_and_cap_holds_and_a_link_without_pace_has_the_cap_alone() -> None:
    cap = TokenBucket(500.0, BURST, 0.0)
    paced = CappedPacer(TokenBucket(2000.0, BURST, 0.0), cap, 0.0)
    assert paced.rate_bytes_per_s == 500.0
    assert paced.reserve(600, 0.0) == pytest.approx(1.0)  # (600 - 100) / 500
    alone = CappedPacer(None, TokenBucket(500.0, BURST, 0.0), 0.0)
    assert alone.rate_bytes_per_s == 500.0 and alone.reserve(100, 0.0) == 0.0
