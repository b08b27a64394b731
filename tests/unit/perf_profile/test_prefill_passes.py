"""``perf.prefill_passes.pass_ends``: the torch engine's passes of one prefill (and the passes
``prfaas profile --pass-tokens`` times)."""

from __future__ import annotations

import pytest

from prfaas.perf.prefill_passes import pass_ends

pytestmark = pytest.mark.timeout(60)


def test_pass_ends_keep_block_boundaries_and_the_chunk_limit() -> None:
    assert pass_ends(0, 229, None, None) == [229]
    assert pass_ends(0, 229, 64, 100) == [64, 128, 192, 229]
    assert pass_ends(0, 229, None, 100) == [100, 200, 229]
    assert pass_ends(10, 300, 128, 50) == [60, 110, 128, 178, 228, 256, 300]
    assert pass_ends(512, 1024, 512, None) == [1024]  # a cached whole block: one pass
