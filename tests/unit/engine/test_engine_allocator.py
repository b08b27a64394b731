"""`engine.torch.allocator`: a process that runs the torch engine reuses its large freed blocks
instead of page-faulting them afresh (a decode step's padded batch, every step), and leaves the
allocator alone where the user chose it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from prfaas.engine.torch.allocator import _tune, user_chose_allocator

pytestmark = pytest.mark.timeout(60)

# 48 MiB malloc'd, written and freed six times, as a decode step's batch cache is each step; the
# minor page faults of the last five. No torch: the allocator is the C library's, a plain
# ctypes malloc shows it. The first argument: "tune" to call tune_malloc first.
ROUNDS = r"""
import ctypes, resource, sys
if sys.argv[1] == "tune":
    from prfaas.engine.torch.allocator import tune_malloc
    assert tune_malloc() == "tuned", tune_malloc()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
n = 48 << 20
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[1:]))
"""


def _faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD"))}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True,
                         env=env, timeout=30)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_tuned_process_reuses_large_blocks_where_the_default_faults_them_again() -> None:
    pages = 5 * (48 << 20) // 4096
    default, tuned = _faults("default"), _faults("tune")
    # glibc's default maps each 48 MiB block afresh: a fault per page, every round.
    assert default > pages // 2, (default, tuned)
    assert tuned < pages // 20, (default, tuned)


def test_the_users_own_allocator_settings_are_left_alone() -> None:
    for env in ({"MALLOC_ARENA_MAX": "2"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
                {"LD_PRELOAD": "/usr/lib/libtcmalloc.so"}):  # fmt: skip
        (name,) = env
        assert user_chose_allocator({"PATH": "/bin", **env}) == name
        assert _tune(env) == f"left alone: {name} is set"
    assert user_chose_allocator({"PATH": "/bin", "HOME": "/root"}) is None
