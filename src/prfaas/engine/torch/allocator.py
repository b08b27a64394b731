"""The C allocator's settings of a process that runs ``engine.torch`` on CPU.

glibc's malloc serves a block above its mmap threshold (dynamic, at most 32 MiB) with a fresh
mapping and unmaps it when freed, and trims its heaps' free tops back to the kernel. A decode step
builds its batch's left-padded cache afresh every step and splits it back (``decode_step``): at
batch 32 and 4,096 tokens of context that is tens of MiB a step, so with glibc's defaults every
step page-faults and zeroes them again. Measured on the tiny Qwen3-Next (2026-12-07, one core,
``bench/decode_step_scaling.py``): 50-62 ms a step at batch 32 x 4,096 and 153 ms at 64 x 6,000
with the defaults, 21-23 ms and 48-49 ms with the settings below; batch 8 x 512 unchanged. Serving
stacks get the same by preloading tcmalloc or jemalloc; this needs neither.

``tune_malloc`` sets fixed thresholds once per process, through ``mallopt``: no block under
1 GiB is mapped apart, the heap top is kept up to 2 GiB and grown 512 MiB at a time (all three
were needed: any one or two left the large steps 1.5-3x slower). Freed memory stays with the
process, up to what its largest steps used: an engine process holds its KV budget anyway. Left
alone where the user chose the allocator (``MALLOC_*`` or ``GLIBC_TUNABLES`` in the environment,
or an ``LD_PRELOAD``) or the C library is not glibc.

No torch import: the loader calls it before the weights are read.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameters (glibc's malloc.h)."""

SETTINGS: tuple[tuple[str, int, int], ...] = (
    ("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, 1 << 30),
    ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, (1 << 31) - 1),
    ("M_TOP_PAD", M_TOP_PAD, 512 << 20),
)

_lock = threading.Lock()
_outcome: str | None = None


def user_chose_allocator(environ: Mapping[str, str]) -> str | None:
    """The environment variable by which the user chose the allocator's settings, or None."""
    for name in sorted(environ):
        if name.startswith("MALLOC_") or name in ("GLIBC_TUNABLES", "LD_PRELOAD"):
            return name
    return None


def tune_malloc(environ: Mapping[str, str] | None = None) -> str:
    """Set glibc's malloc thresholds for this process (once; later calls return the first
    outcome): "tuned", or why not."""
    global _outcome
    with _lock:
        if _outcome is None:
            _outcome = _tune(os.environ if environ is None else environ)
        return _outcome


def _tune(environ: Mapping[str, str]) -> str:
    chosen = user_chose_allocator(environ)
    if chosen is not None:
        return f"left alone: {chosen} is set"
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        version = libc.gnu_get_libc_version
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return "left alone: the C library is not glibc"
    version.restype = ctypes.c_char_p
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    refused = [label for label, param, value in SETTINGS if mallopt(param, value) != 1]
    if refused:
        return f"glibc {version().decode()} refused {', '.join(refused)}"
    return "tuned"
