"""``prfaas profile --engine torch``'s decode step overhead: what ``engine.torch``'s decode step
costs beyond its forward pass, at two batch sizes, so that the decode node's per-token plumbing
measured at batch 1 (``commands.profile_plumbing``) can be split into a per-step and a
per-token term (``perf.plumbing.split_decode_overhead``), and at two contexts, whose difference
is what the engine's cache gathering and splitting costs per context token
(``perf.plumbing.context_cost``: ``decode_per_context_token_s``).

In this process, on the profiled model: for each batch size ``b``, ``b`` requests of
``context_tokens`` random prompt tokens are prefilled and started on a real ``TorchEngine``
(greedy, EOS ignored), then ``steps`` decode steps are timed two ways, alternately: the engine's
own ``step()`` (the hand-off to its engine thread, gathering the batch's caches, the forward,
appending each request's new rows, sampling, the bookkeeping) and the forward pass alone of a
``b``-row batch at the same context, as the profile's decode points time it
(``PassTimer.decode_forward``). The medians' difference is the engine's overhead at ``b``.

Not pure (torch, the clock): a command's helper.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_BATCH_SIZES = (1, 8)
DEFAULT_STEPS = 24
WARMUP_STEPS = 2


def engine_step_overheads(
    model_path: Path,
    *,
    device: str,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    contexts: Sequence[int],
    steps: int = DEFAULT_STEPS,
    seed: int,
) -> dict[tuple[int, int], tuple[float, float]]:
    """Per (batch size, context tokens per request): (median engine step s, median forward-pass
    s)."""
    import torch

    from prfaas.commands.profile_passes import PassTimer
    from prfaas.engine.api import PrefillRequest, SamplingParams
    from prfaas.engine.torch.engine import TorchEngine
    from prfaas.engine.torch.loader import load_model

    if steps < 3:
        raise ValueError(f"steps must be >= 3, got {steps}")
    loaded = load_model(model_path, device=device)
    rng = random.Random(seed)
    passes = PassTimer(loaded, device=device, pass_tokens=None, seed=seed + 1)
    cuda = device.startswith("cuda")

    def prompt(context_tokens: int) -> tuple[int, ...]:
        return tuple(rng.randrange(loaded.vocab_size) for _ in range(context_tokens))

    def timed(fn: Any, *args: Any) -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*args)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    out: dict[tuple[int, int], tuple[float, float]] = {}
    engine = TorchEngine(loaded, max_batch=max(batch_sizes))
    try:
        sampling = SamplingParams(max_new_tokens=steps + WARMUP_STEPS + 2, ignore_eos=True)
        for b, context_tokens in ((b, c) for c in contexts for b in batch_sizes):
            rids = [f"step-{b}-{context_tokens}-{i}" for i in range(b)]
            for rid in rids:
                result = engine.prefill(PrefillRequest(rid, prompt(context_tokens)), keep=True)
                engine.start(result, sampling)
            forward_one = passes.decode_forward(b, context_tokens)
            for _ in range(WARMUP_STEPS):
                engine.step()
            engine_s, forward_s = [], []
            for _ in range(steps):
                engine_s.append(timed(engine.step))
                forward_s.append(forward_one())
            for rid in rids:
                engine.release(rid)
            out[b, context_tokens] = (statistics.median(engine_s), statistics.median(forward_s))
    finally:
        engine.close()
    return out
