"""``prfaas bench --find-max-rate``: steps of constant open-loop (uniform) arrivals against a live
endpoint, judged by ``serve/loadgen/maxrate.py`` (the simulator's capacity rule, as the client
sees it). Every step sends the same requests (``--num-requests``, default 300; same seed, same
lengths; a trace's first requests rescaled to the step's rate) and waits for them to finish.
Prints the capacity and each step; ``--json`` one object (``prfaas.bench.max_rate/1``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from prfaas.errors import UsageError

DEFAULT_STEP_REQUESTS = 300
"""Requests per step without ``--num-requests``: the trend judge is monotone in the rate on any
length, but the first requests of a step find the endpoint empty, so a short step reads low (the
fidelity bench's simulated lognormal workload: 60 requests 5.5-5.8 req/s, 240 and 1,500 6.8)."""


def run_find_max_rate(
    args: argparse.Namespace, url: str, model: str, max_model_len: int | None,
    extra: dict[str, Any], api_key: str | None,
) -> int:  # fmt: skip
    from prfaas.commands.bench_workload import build_workload, clip_to_context
    from prfaas.serve.loadgen import PromptSynth, run_workload
    from prfaas.serve.loadgen.maxrate import LiveRule, LiveStep, find_max_rate_live

    if args.duration is not None:
        raise UsageError("--find-max-rate sends --num-requests per step; drop --duration")
    if args.slo_tpot is not None and not args.slo_tpot > 0:
        raise UsageError(f"--slo-tpot must be > 0, got {args.slo_tpot:g}")
    args.arrival = "uniform"  # constant open-loop rate, as the simulator's rule
    if args.num_requests is None:  # a step's length: a short one reads the capacity low
        args.num_requests = DEFAULT_STEP_REQUESTS
    base = build_workload(args)
    if max_model_len is not None and not args.no_clip:
        base, _ = clip_to_context(base, max_model_len)
    if len(base) < 2:
        raise UsageError("--find-max-rate needs --num-requests >= 2")
    span = base[-1].arrival_s - base[0].arrival_s
    own_rate = (len(base) - 1) / span if span > 0 else float("inf")
    synth = PromptSynth(args.seed, args.vocab_size, args.prompt_format)

    def run_step(rate: float) -> tuple[Sequence[Any], float]:
        scale = own_rate / rate  # the same requests, arriving at ``rate``
        reqs = [dataclasses.replace(r, arrival_s=(r.arrival_s - base[0].arrival_s) * scale)
                for r in base]  # fmt: skip
        results, _ = asyncio.run(
            run_workload(
                reqs, base_url=url, model=model, synth=synth, concurrency=args.concurrency,
                timeout_s=args.timeout, extra_body=extra, api_key=api_key,
            )
        )  # fmt: skip
        return results, reqs[-1].arrival_s

    def show(step: LiveStep) -> None:
        if not args.json:
            t = step.latency_trend  # a failed step's reason says it already
            trend = "" if t is None or not step.passed else f"latency trend {t:+.3f}; "
            print(f"  {step.rate_rps:8.3f} req/s: {'pass' if step.passed else 'FAIL'} "
                  f"({step.why}; {trend}in flight {step.in_flight_half} -> {step.in_flight_end})",
                  flush=True)  # fmt: skip

    rule = LiveRule(slo_tpot_s=args.slo_tpot)
    capacity, steps = find_max_rate_live(run_step, args.rate, rule, show)
    out = {
        "schema": "prfaas.bench.max_rate/1",
        "url": url,
        "model": model,
        "capacity_rps": capacity,
        "definition": "highest constant open-loop arrival rate at which the requests' latencies "
        "do not grow with their send times and the decode SLO holds (serve/loadgen/maxrate.py)",
        "rule": dataclasses.asdict(rule),
        "num_requests_per_step": len(base),
        "extra_body": extra,
        "steps": [dataclasses.asdict(s) for s in steps],
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"capacity: {capacity:.3f} req/s ({len(steps)} steps of {len(base)} requests)")
    return 0 if capacity > 0 else 1
