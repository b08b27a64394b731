"""The profile's passes, timed in this process: the one definition of what a profiled prefill
point measures (``prfaas profile --engine torch``'s curve, ``commands.profile``), and of a decode
point's forward pass (``decode_forward``), which the engine's step is also measured against
(``commands.profile_step``). They time the same ``hf_cache.forward`` calls a serving engine counts
on its ``ForwardClock`` (``engine.torch.forward_clock``), which the plumbing measurement reads
its classes beyond (``commands.profile_plumbing``).

A prefill of ``new`` tokens after ``cached`` ones is ``engine.torch``'s passes
(``perf.prefill_passes.pass_ends``: one pass, or passes ending at multiples of ``pass_tokens``)
over random token ids, on a fresh cache that first holds the ``cached`` tokens (untimed). A
pass's figure is ``pass_seconds``.

Not pure (torch, the clock): a command's helper.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any


def pass_seconds(wall_s: float, cpu_s: float, cuda: bool) -> float:
    """One timed pass's figure. On a GPU, its wall time. On CPU, the smaller of its wall time and
    this process's CPU time over it: a pass that got less than its cores (another process on
    them) took longer in wall time than its work, while its CPU time is the work itself (a
    profile taken beside another job read every pass 1.5x slow: "profiles got 68% of their
    cores"); with several threads busy, CPU time exceeds wall time, and the wall time stands."""
    return wall_s if cuda else min(wall_s, cpu_s)


class PassTimer:
    """Times prefills on a loaded model (``engine.torch.loader.load_model``'s answer)."""

    def __init__(self, loaded: Any, *, device: str, pass_tokens: int | None, seed: int) -> None:
        self.loaded = loaded
        self.pass_tokens = pass_tokens or None
        self.cuda = device.startswith("cuda")
        self._rng = random.Random(seed)

    def ids(self, rows: int, n: int) -> Any:
        import torch

        vocab = self.loaded.vocab_size
        return torch.tensor([[self._rng.randrange(vocab) for _ in range(n)]] * rows)

    @staticmethod
    def positions(rows: int, start: int, n: int) -> Any:
        import torch

        return torch.arange(start, start + n).unsqueeze(0).expand(rows, n)

    def prefill(self, cache: Any, start: int, n: int) -> None:
        """Tokens ``[start, start + n)`` into ``cache``, in the engine's passes."""
        from prfaas.engine.torch.hf_cache import forward
        from prfaas.perf.prefill_passes import pass_ends

        for end in pass_ends(start, start + n, self.pass_tokens, None):
            forward(self.loaded.model, self.ids(1, end - start), cache,
                    self.positions(1, start, end - start))  # fmt: skip
            start = end

    def timed(self, fn: Any, *fn_args: Any) -> float:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        t0, cpu0 = time.perf_counter(), time.process_time()
        fn(*fn_args)
        if self.cuda:
            torch.cuda.synchronize()
        return pass_seconds(time.perf_counter() - t0, time.process_time() - cpu0, self.cuda)

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """One prefill of ``new_tokens`` after ``cached_tokens``, timed (the cached part not)."""
        import torch

        from prfaas.engine.torch.hf_cache import new_cache

        with torch.inference_mode():
            cache = new_cache(self.loaded.model)
            if cached_tokens:
                self.prefill(cache, 0, cached_tokens)
            return self.timed(self.prefill, cache, cached_tokens, new_tokens)

    def decode_forward(self, batch: int, context_tokens: int) -> Callable[[], float]:
        """A timer of one decode forward pass as ``engine.torch`` runs it: ``batch`` rows of
        ``context_tokens`` cached tokens (prefilled once, untimed), gathered into the engine's
        kept buffers on the CPU (``batch_workspace``; afresh on a GPU, as the engine does),
        untimed, then the forward over them, timed: on the CPU it writes its token in place, as
        the engine's does. Each call times one such pass at the same context."""
        import torch

        from prfaas.engine.torch import hf_cache
        from prfaas.engine.torch.batch_workspace import BatchWorkspace

        model, cmap = self.loaded.model, self.loaded.cmap
        workspace = None if self.cuda else BatchWorkspace()
        with torch.inference_mode():
            cache = hf_cache.new_cache(model)
            hf_cache.forward(model, self.ids(batch, context_tokens), cache,
                             self.positions(batch, 0, context_tokens))  # fmt: skip
            rows = hf_cache.split_cache(cache, cmap, [context_tokens] * batch)

        def one() -> float:
            with torch.inference_mode():
                step, _ = hf_cache.build_cache(model, cmap, rows, workspace)
                return self.timed(hf_cache.forward, model, self.ids(batch, 1), step,
                                  self.positions(batch, context_tokens, 1))  # fmt: skip

        return one
