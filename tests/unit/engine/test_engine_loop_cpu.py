"""``engine.torch.core.EngineLoop.slice_cpu_s``: the engine thread's own CPU in its slices, what
a node reports as ``engine_cpu_s`` (beside its process's CPU: the passes against the rest)."""

from __future__ import annotations

import time

import pytest

from prfaas.engine.torch.core import EngineLoop, Task

pytestmark = pytest.mark.timeout(30)


def _burn(cpu_s: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        pass


class _Spin(Task):
    """Burns ``cpu_s`` of this thread's CPU (a pass), in one slice."""

    def __init__(self, cpu_s: float) -> None:
        super().__init__()
        self.cpu_s = cpu_s

    def run_slice(self) -> bool:
        _burn(self.cpu_s)
        self.future.set_result(None)
        return True


class _Sleep(Task):
    """Waits without CPU (as a thread blocked on I/O would)."""

    is_step = True

    def run_slice(self) -> bool:
        time.sleep(0.05)
        self.future.set_result(None)
        return True


class _Fails(_Spin):
    def run_slice(self) -> bool:
        _burn(self.cpu_s)
        raise ValueError("the request's own failure")


def test_the_loop_counts_its_slices_cpu_not_their_waits() -> None:
    loop = EngineLoop("test-engine")
    try:
        assert loop.slice_cpu_s == 0.0
        spin = _Spin(0.03)
        loop.submit(spin)
        spin.future.result(timeout=10)
        after_spin = loop.slice_cpu_s
        assert after_spin >= 0.03
        sleep = _Sleep()
        loop.submit(sleep)
        sleep.future.result(timeout=10)
        # a sleep costs the thread (almost) no CPU, whatever the machine's load
        assert loop.slice_cpu_s - after_spin < 0.02
        failing = _Fails(0.02)  # a slice that fails is counted too: its CPU was spent
        loop.submit(failing)
        with pytest.raises(ValueError):
            failing.future.result(timeout=10)
        assert loop.slice_cpu_s >= after_spin + 0.02
    finally:
        loop.close()
