"""``prfaas profile --engine torch``'s ``shared_core_overhead``: the CPU a node loses beyond its own
work while another busy process time-shares its core (``perf.plumbing``).

Two node processes pinned to one core (``engine.cpus``) each get half of it, and each does its
work in more CPU than alone: every switch between them refills caches the other emptied. The
simulator's ``SharedCores`` charges ``cores / demand`` and, with this term, that much more.

How: this process, pinned to one core of its affinity for the measurement, times the CPU seconds
(``time.process_time``) per pass of prefill passes of ``pass_tokens`` random tokens, and of
64-token passes, on the profiled model, alone (the child stopped) and while a child process
(``python -m prfaas.commands.profile_sharing --child``: the same model, ``pass_tokens`` passes
without end) runs on the same core, alternately, ``rounds`` times each. Per size, the median
shared figure over the median alone one; the term is their mean less 1 (0 if below). CPU
devices only (a GPU's kernels are not time-shared this way).

Not pure (torch, processes, the clock): a command's helper.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prfaas.serve.process_group import die_with_parent

DEFAULT_PASSES = 12
SHORT_PASS_TOKENS = 64
"""A decode-sized pass (a decode step of a small batch reads about as much as it computes)."""
DEFAULT_ROUNDS = 3
READY = "ready"


def _passes(model_path: Path, sizes: tuple[int, ...], seed: int) -> list[Callable[[int], None]]:
    """Per size in ``sizes``: a function running ``n`` prefill passes of that many random tokens,
    each on a fresh cache, on the model loaded here (one torch thread, as a node process on one
    core)."""
    import torch

    from prfaas.engine.torch.hf_cache import forward, new_cache
    from prfaas.engine.torch.loader import load_model

    torch.set_num_threads(1)
    loaded = load_model(model_path, device="cpu")
    rng = random.Random(seed)

    def runner(tokens: int) -> Callable[[int], None]:
        ids = torch.tensor([[rng.randrange(loaded.vocab_size) for _ in range(tokens)]])
        positions = torch.arange(0, tokens).unsqueeze(0)

        def run(n: int) -> None:
            with torch.inference_mode():
                for _ in range(n):
                    forward(loaded.model, ids, new_cache(loaded.model), positions)

        run(1)  # first-call costs
        return run

    return [runner(tokens) for tokens in sizes]


@contextlib.contextmanager
def _pinned(core: int) -> Iterator[None]:
    """This process on ``core`` alone for the block; its affinity as it was afterwards."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def measure_shared_core_overhead(
    model_path: Path,
    *,
    pass_tokens: int,
    seed: int,
    passes: int = DEFAULT_PASSES,
    rounds: int = DEFAULT_ROUNDS,
) -> tuple[float, str]:
    """``(shared_core_overhead, how it was measured)`` for the model at ``model_path`` on the
    lowest core of this process's affinity: the mean over a prefill pass of ``pass_tokens``
    tokens and a decode-sized one (``SHORT_PASS_TOKENS``: a short pass loses more to sharing,
    its working set is refilled as often for less work)."""
    core = min(os.sched_getaffinity(0))
    sizes = (pass_tokens, SHORT_PASS_TOKENS)
    runs = _passes(model_path, sizes, seed)
    alone: dict[int, list[float]] = {t: [] for t in sizes}
    shared: dict[int, list[float]] = {t: [] for t in sizes}
    cmd = [sys.executable, "-m", "prfaas.commands.profile_sharing", "--child", str(model_path),
           str(pass_tokens), str(seed + 1)]  # fmt: skip
    with _pinned(core):
        # Killed with this process whatever ends it: it may be SIGSTOPped at that moment.
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
        try:
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            if line != READY:
                raise RuntimeError(f"the sharing child did not start (said {line!r})")
            for _ in range(rounds):
                for tokens, run in zip(sizes, runs, strict=True):
                    n = 2 * passes if tokens < pass_tokens else passes  # a short one is quick
                    os.kill(child.pid, signal.SIGSTOP)  # this process alone on the core
                    alone[tokens].append(_cpu_s(run, n) / n)
                    os.kill(child.pid, signal.SIGCONT)  # both busy on the core
                    time.sleep(0.05)
                    shared[tokens].append(_cpu_s(run, n) / n)
        finally:
            child.kill()
            child.wait()
    ratios = {t: statistics.median(shared[t]) / statistics.median(alone[t]) for t in sizes}
    overhead = max(0.0, statistics.mean(ratios.values()) - 1.0)
    figures = ", ".join(
        f"{t} tokens {statistics.median(alone[t]) * 1e3:.4g} vs "
        f"{statistics.median(shared[t]) * 1e3:.4g} ms ({ratios[t] - 1:+.1%})"
        for t in sizes
    )
    how = (
        f"CPU seconds per pass (this process, core {core}) alone vs beside a second pinned "
        f"process running {pass_tokens}-token passes, medians of {rounds} rounds: {figures}; "
        f"the mean of the two" + (" (below alone: stored as 0)" if overhead == 0.0 else "")
    )
    return overhead, how


def _cpu_s(run: Callable[[int], None], passes: int) -> float:
    t0 = time.process_time()
    run(passes)
    return time.process_time() - t0


def _child(argv: list[str]) -> int:
    """The competing process: the same passes until it is killed."""
    model_path, pass_tokens, seed = Path(argv[0]), int(argv[1]), int(argv[2])
    (run,) = _passes(model_path, (pass_tokens,), seed)
    print(READY, flush=True)
    while True:
        run(1)


def main(argv: list[str] | None = None) -> Any:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 4 and args[0] == "--child":
        return _child(args[1:])
    print("usage: python -m prfaas.commands.profile_sharing --child MODEL PASS_TOKENS SEED",
          file=sys.stderr)  # fmt: skip
    return 2


if __name__ == "__main__":
    sys.exit(main())
