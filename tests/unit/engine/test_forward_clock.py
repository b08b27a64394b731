"""``engine.torch.forward_clock.ForwardClock``: a thread's CPU inside its timed blocks, what a
``paused`` block inside them took left out, waits not counted, a raising block counted."""

from __future__ import annotations

import time

import pytest

from prfaas.engine.torch.forward_clock import ForwardClock

pytestmark = pytest.mark.timeout(30)


def _burn(cpu_s: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        pass


def test_counts_cpu_inside_timing_less_paused_blocks_and_not_waits() -> None:
    clock = ForwardClock()
    assert clock.total_s == 0.0
    with clock.timing():
        _burn(0.04)
        with clock.paused():  # a hand-out hook inside the pass
            _burn(0.05)
        time.sleep(0.05)  # a wait costs no CPU
    assert 0.04 <= clock.total_s < 0.04 + 0.03
    _burn(0.05)  # outside any pass: not counted
    assert clock.total_s < 0.07


def test_a_pass_that_raises_is_counted() -> None:
    clock = ForwardClock()
    with pytest.raises(RuntimeError), clock.timing():
        _burn(0.03)
        raise RuntimeError("the pass failed after spending its CPU")
    assert clock.total_s >= 0.03
