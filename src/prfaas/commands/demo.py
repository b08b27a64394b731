"""``prfaas demo``: the paper's deployment live on this machine, beside the simulator."""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError

KEYS = ("requests", "completed", "failed", "offloaded", "throughput_rps", "ttft_p50_s",
        "ttft_p90_s", "cross_site_bytes", "link_utilisation")  # fmt: skip


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the paper's PrfaaS-PD deployment live (emulated nodes) beside the simulator",
        description=(
            "Bring up the paper's PrfaaS-PD deployment of emulated 1T-model nodes (H200 PrfaaS, "
            "H20 PD) as real processes on this machine, drive it with the paper's workload at a "
            "rate the homogeneous baseline cannot sustain, do the same with the homogeneous "
            "baseline, and print both beside what the simulator predicts. A tiny real hybrid "
            "model (PyTorch) also answers a prompt through each path, and, where the vLLM venv "
            "exists and the CPU has AVX-512, a tiny model on two vLLM servers answers a long "
            "prompt (prefilled at the PrfaaS site, its KV crossing through PrfaasConnector) and "
            "a short one (prefilled locally). Everything is torn down."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--requests", type=int, default=120, help="requests per deployment")
    p.add_argument("--rate", type=float, default=2.6, help="modelled arrivals per second")
    p.add_argument("--trace", type=Path, default=None, help="replay a Mooncake JSONL slice")
    p.add_argument("--rate-scale", type=float, default=1.0, help="trace speed-up")
    p.add_argument("--time-scale", type=float, default=0.5, help="wall s per modelled s")
    p.add_argument("--byte-divisor", type=int, default=1000, help="payload size divisor")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-torch", action="store_true", help="skip the tiny PyTorch model part")
    p.add_argument("--skip-vllm", action="store_true", help="skip the tiny vLLM model part")
    p.add_argument("--workdir", type=Path, default=None, help="logs (default: a temp folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object (README schema)")
    p.set_defaults(run=run)


def _check(args: argparse.Namespace) -> None:
    if args.requests <= 0:
        raise UsageError(f"--requests must be > 0, got {args.requests}")
    for name in ("rate", "rate_scale", "time_scale"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.byte_divisor < 1:
        raise UsageError(f"--byte-divisor must be >= 1, got {args.byte_divisor}")
    if args.trace is not None and not args.trace.is_file():
        raise UsageError(f"trace file {args.trace} does not exist")


def run(args: argparse.Namespace) -> int:
    _check(args)
    from rich.console import Console
    from rich.progress import Progress

    from prfaas.serve import demo

    console = Console(stderr=args.json)
    settings = demo.DemoSettings(
        num_requests=args.requests, rate_rps=args.rate, time_scale=args.time_scale,
        byte_divisor=args.byte_divisor, seed=args.seed, trace=args.trace,
        rate_scale=args.rate_scale,
    )  # fmt: skip
    try:
        specs = demo.workload(settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="prfaas-demo-"))
    out: dict[str, Any] = {"live": {}, "sim": {}, "settings": _settings_json(settings, specs)}
    with Progress(console=console, transient=False) as progress:
        for dep in demo.deployments(settings.link_gbps):
            task = progress.add_task(f"live {dep.name}", total=len(specs))
            out["live"][dep.policy] = demo.run_live(
                dep, settings, specs, workdir, on_done=functools.partial(progress.advance, task)
            )
            sim_task = progress.add_task(f"sim {dep.name}", total=1)
            out["sim"][dep.policy] = demo.run_sim(dep, settings, specs)
            for src in ("live", "sim"):
                demo.add_money(dep, out[src][dep.policy], specs)
            progress.advance(sim_task)
        if not args.skip_torch:
            task = progress.add_task("tiny PyTorch hybrid model, both paths", total=1)
            out["torch"] = demo.torch_showcase(workdir)
            progress.advance(task)
        if not args.skip_vllm:
            from prfaas.serve import demo_vllm

            reason = demo_vllm.vllm_unavailable()
            if reason is not None:
                out["vllm"] = {"skipped": reason}
            else:
                task = progress.add_task("tiny model on vLLM servers, both routes", total=1)
                out["vllm"] = demo_vllm.vllm_showcase(workdir)
                progress.advance(task)
    out["agreement"] = {
        policy: route_agreement(out["live"][policy], out["sim"][policy]) for policy in out["live"]
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(console, out, workdir)
    return 0


def route_agreement(live: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """Requests that took the same route (offloaded or not) live and in the simulator."""
    pairs = list(zip(live["offloaded_by_request"], sim["offloaded_by_request"], strict=True))
    same = sum(1 for a, b in pairs if a is not None and a == b)
    return {
        "requests": len(pairs),
        "same_route": same,
        "throughput_live_over_sim": live["throughput_rps"] / max(sim["throughput_rps"], 1e-9),
        "ttft_p50_live_over_sim": live["ttft_p50_s"] / max(sim["ttft_p50_s"], 1e-9),
        "ttft_p90_live_over_sim": live["ttft_p90_s"] / max(sim["ttft_p90_s"], 1e-9),
    }


def _settings_json(s: Any, specs: Any) -> dict[str, Any]:
    return {
        "requests": len(specs), "rate_rps": s.rate_rps, "time_scale": s.time_scale,
        "byte_divisor": s.byte_divisor, "trace": str(s.trace) if s.trace else None,
        "link_gbps": s.link_gbps, "shaped_link_gbps": s.link_gbps / s.byte_divisor / s.time_scale,
    }  # fmt: skip


def _print(console: Any, out: dict[str, Any], workdir: Path) -> None:
    from rich.table import Table

    st = out["settings"]
    table = Table(
        title=(
            f"{st['requests']} requests at {st['rate_rps']} req/s (modelled); time x"
            f"{1 / st['time_scale']:g}, bytes /{st['byte_divisor']}; link {st['link_gbps']:g} Gbps "
            f"paced at {st['shaped_link_gbps']:.2f} Gbps"
        )
    )
    table.add_column("")
    runs = [(p, src) for p in out["live"] for src in ("live", "sim")]
    for policy, src in runs:
        table.add_column(f"{'PrfaaS-PD' if policy != 'local_only' else 'homogeneous'} {src}",
                         justify="right")  # fmt: skip

    def cell(policy: str, src: str, fmt: Any) -> str:
        return str(fmt(out[src][policy]))

    rows = [
        ("completed / requests", lambda d: f"{d['completed']} / {d['requests']}"),
        ("offloaded to PrfaaS", lambda d: f"{d['offloaded']}"),
        ("throughput (req/s)", lambda d: f"{d['throughput_rps']:.2f}"),
        ("TTFT P50 / P90 (s)", lambda d: f"{d['ttft_p50_s']:.2f} / {d['ttft_p90_s']:.2f}"),
        ("cross-site GB", lambda d: f"{d['cross_site_bytes'] / 1e9:.1f}"),
        ("$/h; $/M output tokens", lambda d: "-" if not d.get("money") else
         f"{d['money']['usd_per_hour']:.0f}; {d['money']['usd_per_million_output_tokens']:.1f}"),
        ("link utilisation", lambda d: f"{d['link_utilisation']:.1%}"),
        ("prefix hit rate", lambda d: ", ".join(f"{k} {v:.0%}" for k, v in
                                                 sorted(d["prefix_hit_rate"].items())) or "-"),
    ]  # fmt: skip
    for label, fmt in rows:
        table.add_row(label, *(cell(p, s, fmt) for p, s in runs))
    console.print(table)
    for policy, agree in out["agreement"].items():
        console.print(
            f"{policy}: {agree['same_route']}/{agree['requests']} requests took the same route "
            f"live and simulated; live / sim throughput {agree['throughput_live_over_sim']:.2f}, "
            f"TTFT P50 {agree['ttft_p50_live_over_sim']:.2f}, "
            f"P90 {agree['ttft_p90_live_over_sim']:.2f}"
        )
    if out["agreement"]:
        console.print(
            "(the live nodes here are emulated: they sleep the simulator's own cost model, so "
            "this agreement holds largely by construction and tests the plumbing, not the "
            "predictions; real engines against the simulator: docs/fidelity.md)"
        )
    if "torch" in out:
        for ans in out["torch"]["answers"]:
            same = "identical" if ans["identical_to_single_process"] else "DIFFERENT"
            console.print(
                f"tiny Qwen3-Next, {ans['prompt_tokens']}-token prompt prefilled at "
                f"{ans['prefill_site']}: tokens {same} to single-process generation"
            )
    vllm = out.get("vllm")
    if vllm is not None and "skipped" in vllm:
        console.print(f"vLLM part skipped: {vllm['skipped']}")
    elif vllm is not None:
        for ans in vllm["answers"]:
            kv = "-" if ans["kv_bytes"] is None else f"{ans['kv_bytes'] / 1e6:.2f} MB"
            console.print(
                f"tiny llama on vLLM, {ans['prompt_tokens']}-token prompt prefilled at "
                f"{ans['prefill_site']} ({ans['prefill_node']} -> {ans['decode_node']}): "
                f"KV across {kv}, TTFT {ans['ttft_s'] * 1e3:.0f} ms, "
                f"{ans['completion_tokens']} tokens"
            )
    console.print(f"logs: {workdir}")
