"""``engine.torch``'s real decode step against what a profile prices it at, by batch and context.

A torch profile's decode points time the forward pass alone over a batch already gathered
(``PassTimer.decode_forward``: on the CPU into the engine's kept buffers, its token written in
place, as the engine's step does); the engine's step also gathers its running requests' caches
into that batch and appends each one's new rows to its own buffer every step, which
``prfaas profile`` prices as ``plumbing.decode_per_context_token_s``, measured at batch 1 and 8
(``commands.profile_step``) and charged linearly in the batch's padded context. This bench
times, for each ``B:CTX`` (``B`` requests of ``CTX`` context tokens each), the engine's own
``step()`` and that forward at the same batch, alternately (``commands.profile_step``'s
``engine_step_overheads``, medians), and prints them beside the profile's price for the
engine's step: its decode fit plus that term. The relay terms (the node's HTTP, the gateway) are
not in either side.

    taskset -c 0 .venv/bin/python bench/decode_step_scaling.py \\
        --model WORKDIR/tiny-fidelity --profile WORKDIR/pd-core0.yaml

(``WORKDIR``: a ``bench/fidelity.py --workdir``; pin it to the core the profile was measured
on.) Measured on 2026-12-07 (docs/engine.md): while the step gathered into fresh tensors and the
forward concatenated into fresh ones, glibc page-faulted them in every step, and from batch 32
at 4,096 tokens the step took 1.1-2.5x its price; with the kept buffers (engine.torch since
then), 32 x 4,096 took 21 ms and 64 x 6,000 44 ms, under the forward that concatenates. Each
point runs in this one process, after the ones before it, so the order of ``--points`` can move
the figures: give one point a run to time it from a fresh process.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from prfaas.commands.profile_step import engine_step_overheads
from prfaas.perf.profile_costs import cost_model_from_profile_file

DEFAULT_POINTS = ("1:512", "1:4096", "8:512", "8:4096", "16:512", "16:4096", "32:512",
                  "32:4096", "64:1024", "64:4096")  # fmt: skip


def parse_point(text: str) -> tuple[int, int]:
    try:
        b, ctx = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected BATCH:CONTEXT, e.g. 32:4096"
        ) from None
    if b < 1 or ctx < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: batch and context must be >= 1")
    return b, ctx


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="the model folder (make-tiny's)")
    p.add_argument("--profile", type=Path, required=True, help="its profile (prfaas profile)")
    p.add_argument("--points", type=parse_point, nargs="+", metavar="B:CTX",
                   default=[parse_point(x) for x in DEFAULT_POINTS])  # fmt: skip
    p.add_argument("--steps", type=int, default=12, help="timed steps a point (medians)")
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args(argv)
    if not (args.model / "config.json").is_file():
        p.error(f"--model {args.model}: no config.json there")
    if not args.profile.is_file():
        p.error(f"--profile {args.profile}: no such file")
    if args.steps < 3:
        p.error(f"--steps must be >= 3, got {args.steps}")
    cm = cost_model_from_profile_file(args.profile)
    per_ctx = cm.plumbing.decode_per_context_token_s
    print(
        f"profile {args.profile}: the engine's step priced at the decode fit + "
        f"decode_per_context_token_s {per_ctx * 1e9:.1f} ns x batch x padded context"
    )
    print(f"{'batch':>5} {'context':>7} {'padded':>8}  {'engine step':>11} {'bare forward':>12} "
          f"{'priced':>8}  {'engine/priced':>13} {'engine/forward':>14}")  # fmt: skip
    for b, ctx in args.points:
        # One point at a time: each measures its own batch (prefilled afresh), and a long one's
        # figures print before the next starts.
        (engine_s, forward_s), = engine_step_overheads(
            args.model, device="cpu", batch_sizes=(b,), contexts=(ctx,), steps=args.steps,
            seed=args.seed,
        ).values()  # fmt: skip
        priced_s = cm.decode_step_s(b, b * ctx) + per_ctx * b * ctx
        print(f"{b:>5} {ctx:>7} {b * ctx:>8}  {engine_s * 1e3:>8.2f} ms {forward_s * 1e3:>9.2f} ms "
              f"{priced_s * 1e3:>5.2f} ms  {engine_s / priced_s:>13.2f} "
              f"{engine_s / forward_s:>14.2f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
