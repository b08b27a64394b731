"""How `prfaas profile --engine torch` times one pass (`commands.profile_passes.pass_seconds`)."""

from __future__ import annotations

import pytest

from prfaas.commands.profile_passes import pass_seconds

pytestmark = pytest.mark.timeout(10)


def test_on_cpu_a_pass_that_shared_its_core_counts_its_work_not_its_wait() -> None:
    assert pass_seconds(0.15, 0.10, cuda=False) == 0.10  # another job took a third of the core


def test_on_cpu_several_busy_threads_keep_the_wall_time() -> None:
    assert pass_seconds(0.10, 0.38, cuda=False) == 0.10  # four threads: CPU time is 4x wall


def test_on_a_gpu_the_wall_time_stands() -> None:
    assert pass_seconds(0.10, 0.01, cuda=True) == 0.10  # the host CPU mostly waits on kernels
