"""The request list ``prfaas bench`` sends: built from its flags (a synthetic log-normal or a
Mooncake trace) and cut to the server's context. Shared by the single run (``commands/bench``) and
the capacity search (``commands/bench_maxrate``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from prfaas.errors import UsageError

if TYPE_CHECKING:
    from prfaas.serve.loadgen import BenchRequest


def build_workload(args: argparse.Namespace) -> list[BenchRequest]:
    from prfaas.analytic import TruncatedLogNormal
    from prfaas.serve.loadgen import synthetic_workload, trace_workload

    num_requests = args.num_requests
    if num_requests is None and args.duration is None:
        num_requests = 100
    try:
        if args.trace is not None:
            return trace_workload(
                args.trace, rate_scale=args.rate_scale, num_requests=num_requests,
                duration_s=args.duration, num_output_tokens=args.output_tokens,
            )  # fmt: skip
        lengths = TruncatedLogNormal(args.mu, args.sigma, args.min_tokens, args.max_tokens)
        return synthetic_workload(
            rate_rps=args.rate, arrival=args.arrival, lengths=lengths,
            num_output_tokens=args.output_tokens or 64, num_requests=num_requests,
            duration_s=args.duration, seed=args.seed,
        )  # fmt: skip
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def clip_to_context(
    requests: list[BenchRequest], max_model_len: int
) -> tuple[list[BenchRequest], int]:
    """Make every request fit the server's context; return them and how many changed.

    The prompt keeps room for min(max_tokens, a quarter of the context) output tokens, then
    max_tokens is cut to what is left: long prompts stay long, long answers get shorter.
    """
    import dataclasses

    out: list[BenchRequest] = []
    num_clipped = 0
    for r in requests:
        reserve = max(1, min(r.max_tokens, max_model_len // 4))
        num_prompt = min(r.num_prompt_tokens, max_model_len - reserve)
        max_tokens = min(r.max_tokens, max_model_len - num_prompt)
        if (num_prompt, max_tokens) != (r.num_prompt_tokens, r.max_tokens):
            num_clipped += 1
            r = dataclasses.replace(r, num_prompt_tokens=num_prompt, max_tokens=max_tokens)
        out.append(r)
    return out, num_clipped
