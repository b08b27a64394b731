"""Fidelity check: does ``prfaas sim`` predict a live deployment whose nodes really compute?

    .venv/bin/python bench/fidelity.py                      # the full check (~15-25 min here)
    .venv/bin/python bench/fidelity.py --json out.json      # and the figures as JSON
    .venv/bin/python bench/fidelity.py --quick              # a tiny end-to-end run (the test's)

Steps, all from this script (docs/fidelity.md has the method, the figures and why they differ):
1. A tiny random-weight Qwen3-Next hybrid (3 Gated DeltaNet : 1 gated attention layers, fp32,
   torch fallbacks), small enough that a few thousand prompt tokens prefill in 0.1-1 s on a core.
2. ``prfaas profile --engine torch`` of that model twice, apart and beforehand: under
   ``taskset -c 1`` (the PrfaaS node's core) and ``taskset -c 0`` (the PD site's core), on random
   prompts of their own seed (none of the run's prompts; nothing is fitted to the runs).
3. A deployment file (``engine: {kind: torch}``, the ``prfaas`` router, ``hardware:`` the two
   profile files): one PrfaaS site of one prefill node, one PD site of a prefill and a decode node.
4. Live: ``Launcher`` runs it (gateway + one process per node); each site's ``engine.cpus``
   pins its node processes, every thread (the PrfaaS node to core 1, the PD site's two nodes to
   core 0, which they share; the gateway and this load client are left to the scheduler). The
   simulator reads the same field: nodes on one core share it. Two scenarios:
   a Mooncake trace slice (its prefix reuse kept: a hash id becomes the same 512 tokens wherever
   it appears) and a synthetic burst (gamma inter-arrivals, cv 3, log-normal lengths). Each is run
   first overloaded (at ``--overload`` x the simulator's capacity: the measured capacity is
   completed / makespan), then at ``--loads`` fractions of that measured capacity (0.5, 0.95).
5. The simulator runs exactly the same requests (same arrivals, lengths, block hashes) from the
   same deployment file, its timings from the same profile files.
6. Side by side: completed requests, throughput, TTFT P50/P90, the route (offloaded or not) of
   every request compared one by one, prefix hit rates per site; medians over ``--repeats``.

What the two sides share by construction and what they do not: docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
MODEL_NAME = "tiny-fidelity"
"""The folder's name: ``prfaas profile`` records it as the model name, and ``engine.model`` must
match it for a profile file to be accepted."""
MODEL_OVERRIDES: dict[str, Any] = {"max_position_embeddings": 16384}
"""Over ``make_tiny``'s Qwen3-Next (hidden 64, 4 layers, 3 linear : 1 full): longer contexts."""
BLOCK_TOKENS = 512
"""The trace's block size (a hash id is 512 tokens), the gateway's and the simulator's."""
PROFILE_SEED = 7919
"""Random prompt ids of the profile runs: unrelated to the runs' prompts (PromptSynth seed 0)."""
PRFAAS_CORE, PD_CORE = 1, 0
WARMUP_SEED = 4242
PSK = "fidelity-bench-psk-0123456789abcdef"


@dataclass(frozen=True, slots=True)
class Settings:
    workdir: Path
    trace_requests: int = 80
    trace_offset: int = 0
    burst_requests: int = 80
    max_prompt_tokens: int = 8192
    output_tokens: int = 8
    loads: tuple[float, ...] = (0.5, 0.95)
    overload: float = 2.0
    """The capacity runs arrive at this many times the simulator's capacity (its throughput with
    every request at once): overloaded, yet with prefill queues short of the KV receivers' 30 s
    stall timeout (``transfer.stall_timeout_s``), which a longer wait trips (docs/fidelity.md)."""
    repeats: int = 1
    threshold_tokens: int | None = None
    """None: chosen so the PrfaaS and PD prefill cores get similar work (see ``balanced_t``)."""
    profile_new_tokens: tuple[int, ...] = (256, 1024, 2048, 4096, 8192)
    profile_cached_tokens: tuple[int, ...] = (0, 2048)
    profile_batches: tuple[int, ...] = (1, 4, 8)
    profile_contexts: tuple[int, ...] = (512, 4096)
    profile_repeats: int = 3
    scenarios: tuple[str, ...] = ("trace", "burst")


QUICK = {
    "trace_requests": 6,
    "burst_requests": 6,
    "max_prompt_tokens": 1024,
    "output_tokens": 4,
    "loads": (0.9,),
    "profile_new_tokens": (128, 1024),
    "profile_cached_tokens": (0,),
    "profile_batches": (1, 2),
    # The full run's contexts: the cost model sizes the decode batch at 8K tokens of context,
    # and a fit over 64-256 tokens, one noisy repeat each, once extrapolated there to a step
    # over the 25 ms budget ("cannot meet the decode SLO", a failed clean-clone run).
    "profile_contexts": (512, 4096),
    "profile_repeats": 1,
}


def say(msg: str) -> None:
    print(f"[fidelity {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- 1. the model --------------------------------------------------------------------------------
def make_model(workdir: Path) -> Path:
    out = workdir / MODEL_NAME
    if (out / "config.json").is_file():
        return out
    from prfaas.engine.torch.tiny import make_tiny

    say(f"making the model in {out}")
    return make_tiny("qwen3_next", out, overrides=MODEL_OVERRIDES)


# -- 2. the profiles -----------------------------------------------------------------------------
def profile_command(model: Path, out: Path, core: int, s: Settings) -> list[str]:
    """``prfaas profile --engine torch`` under ``taskset -c CORE`` (torch then sees one core and
    takes one thread, as a node process does)."""
    return [
        "taskset", "-c", str(core), sys.executable, "-m", "prfaas.cli", "profile",
        "--engine", "torch", "--model-path", str(model), "-o", str(out),
        "--hardware", f"cpu-core{core}", "--seed", str(PROFILE_SEED),
        "--pass-tokens", str(BLOCK_TOKENS),
        "--repeats", str(s.profile_repeats),
        "--new-tokens", *map(str, s.profile_new_tokens),
        "--cached-tokens", *map(str, s.profile_cached_tokens),
        "--batch-sizes", *map(str, s.profile_batches),
        "--contexts", *map(str, s.profile_contexts),
    ]  # fmt: skip


def profile_cores(model: Path, outs: dict[int, Path], s: Settings) -> None:
    """Profile each core at once, each in its own pinned process: as in the live runs, both
    cores are busy together (shared caches and memory bandwidth), and it takes half the time."""
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    procs = {}
    for core, out in outs.items():
        if out.is_file():
            continue
        say(f"profiling on core {core} -> {out.name}")
        procs[core] = subprocess.Popen(
            profile_command(model, out, core, s), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
    import resource

    start_wall = time.perf_counter()
    start_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    failed = []
    try:
        for core, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=3600)
            if proc.returncode != 0:
                failed.append(f"core {core} ({proc.returncode}):\n{stderr[-2000:]}")
            for line in stdout.splitlines():
                say(f"  core {core}: {line.strip()}")
    finally:  # interrupted (SIGTERM, a timeout): no profile is left running
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if procs:
        end = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = end.ru_utime + end.ru_stime - start_cpu.ru_utime - start_cpu.ru_stime
        share = used / (len(procs) * (time.perf_counter() - start_wall))
        say(f"profiles got {share:.0%} of their cores on average (CPU s / wall s)")
        (s.workdir / "profile-core-share.txt").write_text(f"{share:.4f}\n")
    if failed:
        raise SystemExit("prfaas profile failed on " + "\n".join(failed))


# -- 3. the deployment file ----------------------------------------------------------------------
def deployment_dict(model: Path, threshold_tokens: int, s: Settings) -> dict[str, Any]:
    return {
        "engine": {
            "kind": "torch", "model": MODEL_NAME, "model_path": str(model),
            "block_tokens": BLOCK_TOKENS, "checkpoint_every_blocks": 1, "threads": 1,
            "prefix_store_mib": 256, "kv_budget_mib": 1024,
        },
        "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 600,
                    "max_inflight": 1024, "max_queued": 4096, "route_log_size": 100000},
        "policy": {
            "router": "prfaas", "threshold_tokens": threshold_tokens,
            # t stays the file's on both sides: the live torch gateway has no cost model to
            # re-search it with (issue 13 item 6), so the simulator does not re-search it either.
            "tune_min_samples": 1_000_000,
        },
        "sites": [
            # Each site's node processes on its own core (the worker pins itself, every thread
            # with it); the PD site's two nodes share core 0, which the simulator models too.
            {"name": "prfaas", "kind": "prfaas", "hardware": f"prfaas-core{PRFAAS_CORE}.yaml",
             "engine": {"cpus": str(PRFAAS_CORE)},
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": f"pd-core{PD_CORE}.yaml",
             "engine": {"cpus": str(PD_CORE)},
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]},
        ],
        # Loopback: the tiny model's KV (512 B/token) never makes this link matter.
        "links": [{"src": "prfaas", "dst": "pd", "gbps": 10, "rtt_ms": 0}],
        "psk": PSK,
        "simulation": {
            "prefix_cache": True,
            "cache_bytes_per_node": 256 * (1 << 20),  # the node's prefix_store_mib
            # engine.torch prefills one request at a time, oldest first (core.EngineLoop): so
            # does the simulator with a one-token budget (the head request always goes alone).
            "prefill_token_budget": 1,
            "tune": False,
            "drain_s": 3600,
        },
        "workload": {"output_tokens": s.output_tokens},
    }  # fmt: skip


def write_deployment(workdir: Path, model: Path, threshold_tokens: int, s: Settings) -> Path:
    path = workdir / "fidelity-deployment.yaml"
    header = "# Written by bench/fidelity.py: the deployment it runs live and simulates.\n"
    path.write_text(header + yaml.safe_dump(deployment_dict(model, threshold_tokens, s)))
    return path


def balanced_t(specs: Sequence[Any], prfaas: Any, local: Any) -> int:
    """The threshold that splits the prompts' prefill time most evenly between the two prefill
    cores (both from the profiles, prefix reuse ignored). The planner's ``t`` balances node pools
    for the paper's PrfaaS-PD shape; here there is one node each side, so the split is direct."""
    lengths = sorted(sp.num_prompt_tokens for sp in specs)
    best_t, best_gap = lengths[-1], math.inf
    for t in sorted({0, *lengths}):
        remote = sum(prfaas.prefill_s(n) for n in lengths if n > t)
        home = sum(local.prefill_s(n) for n in lengths if n <= t)
        if abs(remote - home) < best_gap:
            best_t, best_gap = t, abs(remote - home)
    return best_t


# -- 4. the workloads ----------------------------------------------------------------------------
def trace_specs(s: Settings) -> list[Any]:
    """A slice of the Mooncake trace, prompts cut to ``max_prompt_tokens`` (their block hashes
    with them), ``output_tokens`` each; arrival times as in the trace (rescaled per load)."""
    from prfaas.workload.mooncake import read_mooncake
    from prfaas.workload.requests import SimRequestSpec

    records = list(read_mooncake(TRACE, limit=s.trace_offset + s.trace_requests))
    records = records[s.trace_offset :]
    t0 = records[0].arrival_s
    out = []
    for i, rec in enumerate(records):
        n = min(rec.num_prompt_tokens, s.max_prompt_tokens)
        hashes = tuple(rec.block_hashes[: -(-n // BLOCK_TOKENS)])
        out.append(SimRequestSpec(i, rec.arrival_s - t0, n, s.output_tokens, hashes))
    return out


def burst_specs(s: Settings) -> list[Any]:
    """Gamma inter-arrivals (cv 3: bursts and lulls) at a mean of 1 request/s (rescaled per
    load), log-normal prompt lengths around 2,000 tokens, no shared prefixes."""
    from prfaas.workload.arrivals import ArrivalSpec
    from prfaas.workload.lengths import TruncatedLogNormal
    from prfaas.workload.requests import synthetic_requests

    lengths = TruncatedLogNormal(math.log(2000), 0.8, 128, s.max_prompt_tokens)
    gen = synthetic_requests(
        ArrivalSpec("gamma", 1.0, cv=3.0), lengths, s.output_tokens, 10.0 * s.burst_requests,
        random.Random(11),
    )  # fmt: skip
    specs = list(gen)[: s.burst_requests]
    if len(specs) < s.burst_requests:
        raise SystemExit(f"burst: only {len(specs)} arrivals drawn")
    return specs


def at_rate(specs: Sequence[Any], rate_rps: float) -> list[Any]:
    """The same requests with arrival times scaled so their mean rate is ``rate_rps``
    (requests - 1 over the span from the first to the last arrival)."""
    span = specs[-1].arrival_s - specs[0].arrival_s
    if span <= 0:
        return [replace(sp, arrival_s=i / rate_rps) for i, sp in enumerate(specs)]
    k = (len(specs) - 1) / rate_rps / span
    return [replace(sp, arrival_s=(sp.arrival_s - specs[0].arrival_s) * k) for sp in specs]


# -- per-request results (both sides) ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Outcome:
    index: int
    ok: bool
    arrival_s: float
    ttft_s: float | None
    finish_s: float | None
    """From the start of the run (the first arrival)."""
    offloaded: bool | None
    prefill_site: str | None
    num_prompt_tokens: int
    num_cached_tokens: int | None
    reason: str | None = None
    """Live: the router's reason (decision log); digits replaced by N, so reasons group."""
    attempts: int | None = None
    """Live: prefill attempts (over 1: the first was lost and the request retried)."""


def summarize(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    ok = [o for o in outcomes if o.ok]
    ttfts = sorted(o.ttft_s for o in ok if o.ttft_s is not None)
    end = max((o.finish_s or 0.0 for o in ok), default=0.0)
    looked: dict[str, int] = {}
    hit: dict[str, int] = {}
    for o in ok:
        if o.prefill_site is None or o.num_cached_tokens is None:
            continue
        looked[o.prefill_site] = looked.get(o.prefill_site, 0) + o.num_prompt_tokens
        hit[o.prefill_site] = hit.get(o.prefill_site, 0) + o.num_cached_tokens
    total_looked = sum(looked.values())
    return {
        "requests": len(outcomes),
        "completed": len(ok),
        "throughput_rps": len(ok) / end if end > 0 else 0.0,
        "makespan_s": end,
        "ttft_p50_s": _quantile(ttfts, 0.5),
        "ttft_p90_s": _quantile(ttfts, 0.9),
        "offloaded": sum(1 for o in ok if o.offloaded),
        "retried": sum(1 for o in ok if o.attempts is not None and o.attempts > 1),
        "route_reasons": dict(Counter(o.reason for o in ok if o.reason is not None)),
        "prefix_hit_rate": {k: hit[k] / looked[k] for k in sorted(looked)},
        "prefix_hit_rate_all": sum(hit.values()) / total_looked if total_looked else 0.0,
    }


def _quantile(xs: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), of sorted ``xs``."""
    if not xs:
        return None
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# -- 5. the simulator ----------------------------------------------------------------------------
def run_sim(deployment: Path, specs: Sequence[Any]) -> list[Outcome]:
    from prfaas import scenarios
    from prfaas.config import load_deployment
    from prfaas.sim.simulator import Simulator

    d = load_deployment(deployment)
    sc = scenarios.sim_scenario(d)
    sc = replace(sc, duration_s=specs[-1].arrival_s + 1e-6, warmup_s=0.0)
    sim = Simulator(sc, iter(specs))
    site_of_node = {str(n.node_id): str(n.site_id) for n in sim.world.nodes}
    done: dict[int, Outcome] = {}

    def finish(req: Any) -> None:
        done[req.index] = Outcome(
            req.index, True, req.arrival_s, req.kv_ready_s - req.arrival_s, req.finish_s,
            bool(req.offloaded), site_of_node.get(str(req.prefill_node)), req.num_prompt,
            req.num_cached,
        )  # fmt: skip

    sim.on_finish = finish
    sim.run()
    global LAST_SIM_BUSY_S
    LAST_SIM_BUSY_S = {str(n.node_id): n.busy_s for n in sim.world.nodes}
    return [
        done.get(sp.index)
        or Outcome(
            sp.index, False, sp.arrival_s, None, None, None, None, sp.num_prompt_tokens, None
        )
        for sp in specs
    ]  # fmt: skip


# -- 4. live -------------------------------------------------------------------------------------
NODES = ("pf0", "p0", "d0")
SIM_NODE = {"pf0": "prfaas/p0", "p0": "pd/p0", "d0": "pd/d0"}
"""The live nodes' names in the simulator (which numbers each site's nodes by role)."""
LAST_SIM_BUSY_S: dict[str, float] = {}
"""Busy seconds of each simulated node in the last ``run_sim`` (its cost model's work)."""
LAST_LIVE_CPU_S: dict[str, float] = {}
"""CPU seconds each live node process used during the last ``run_live``'s measured requests."""


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_live(deployment: Path, specs: Sequence[Any], workdir: Path) -> list[Outcome]:
    from prfaas.config import load_deployment
    from prfaas.serve.launcher import Launcher
    from prfaas.serve.loadgen import BenchRequest, PromptSynth, run_workload
    from prfaas.serve.loadgen.export import match_routes

    d = load_deployment(deployment)
    workdir.mkdir(parents=True, exist_ok=True)
    decisions = workdir / "decisions.jsonl"
    d = d.model_copy(
        update={"gateway": d.gateway.model_copy(update={"decision_log": str(decisions)})}
    )
    reqs = [
        BenchRequest(sp.index, sp.arrival_s, sp.num_prompt_tokens, sp.num_output_tokens,
                     sp.block_hashes)
        for sp in specs
    ]  # fmt: skip
    synth = PromptSynth(seed=0, vocab_size=256)
    extra = {"return_token_ids": True, "ignore_eos": True}
    with Launcher(d, workdir) as launcher:
        # Warm-up, unmeasured: one prompt down each path (first passes allocate and load lazily).
        t = d.policy.threshold_tokens or 0
        warm = [BenchRequest(i, 0.0, n, 2) for i, n in enumerate((max(16, t // 2), t + 512))]
        asyncio.run(
            run_workload(warm, base_url=launcher.url, model=MODEL_NAME,
                         synth=PromptSynth(seed=WARMUP_SEED), concurrency=1, timeout_s=300,
                         extra_body=extra)
        )  # fmt: skip
        pids = {name: launcher.child(name).proc.pid for name in NODES}
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        results, _ = asyncio.run(
            run_workload(reqs, base_url=launcher.url, model=MODEL_NAME, synth=synth,
                         concurrency=4096, timeout_s=600, extra_body=extra)
        )  # fmt: skip
        LAST_LIVE_CPU_S.clear()
        LAST_LIVE_CPU_S.update({name: cpu_s(pid) - before[name] for name, pid in pids.items()})
        routes = launcher.routes()
    matched = match_routes(reqs, results, routes, synth)
    reasons = _route_reasons(decisions)
    by_index = {r.index: r for r in results}
    out = []
    for sp in specs:
        r = by_index.get(sp.index)
        route = matched.get(sp.index)
        ok = r is not None and r.ok
        out.append(
            Outcome(
                sp.index, ok, sp.arrival_s,
                r.ttft_s if ok and r is not None else None,
                (r.sent_s + (r.latency_s or 0.0)) if ok and r is not None else None,
                None if route is None else bool(route["offloaded"]),
                None if route is None else str(route["prefill_site"]),
                sp.num_prompt_tokens,
                None if route is None else int(route["num_cached_tokens"]),
                None if route is None else reasons.get(str(route["request_id"])),
                None if route is None else int(route["attempts"]),
            )
        )  # fmt: skip
    return out


def _route_reasons(path: Path) -> dict[str, str]:
    """Request id -> the deployment router's reason for its (first) route, from the gateway's
    decision log (``gateway.decision_log``)."""
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") != "route" or rec.get("router") != "primary" or not rec["decision"]:
            continue
        rid = str(rec["request"]["request_id"])
        out.setdefault(rid, re.sub(r"\d+", "N", str(rec["decision"]["reason"])))
    return out


# -- 6. side by side -----------------------------------------------------------------------------
def route_agreement(live: Sequence[Outcome], sim: Sequence[Outcome]) -> dict[str, Any]:
    pairs = [
        (a.offloaded, b.offloaded) for a, b in zip(live, sim, strict=True)
        if a.offloaded is not None and b.offloaded is not None
    ]  # fmt: skip
    same = sum(1 for a, b in pairs if a == b)
    return {
        "compared": len(pairs),
        "agree": same,
        "share": same / len(pairs) if pairs else None,
        "live_only_offloaded": sum(1 for a, b in pairs if a and not b),
        "sim_only_offloaded": sum(1 for a, b in pairs if b and not a),
    }


def _median(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def _merge(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats of every numeric figure (hit rates per site too)."""
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, dict):
            out[key] = {k: _median([r[key].get(k) for r in runs]) for k in first}
        elif isinstance(first, int | float) or first is None:
            out[key] = _median([r[key] for r in runs])
        else:
            out[key] = first
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def compare_row(
    scenario: str, load: str, rate: float, live_runs: list[list[Outcome]], sim: list[Outcome]
) -> dict[str, Any]:
    live_sums = [summarize(r) for r in live_runs]
    live = _merge(live_sums)
    simmed = summarize(sim)
    agreement = _merge([route_agreement(r, sim) for r in live_runs])
    return {
        "scenario": scenario,
        "load": load,
        "offered_rps": rate,
        "live": live,
        "live_repeats": live_sums,
        "sim": simmed,
        "route_agreement": agreement,
        "ratio": {
            key: _ratio(simmed[key], live[key])
            for key in ("throughput_rps", "ttft_p50_s", "ttft_p90_s")
        },
    }


def per_request(
    specs: Sequence[Any], live: Sequence[Outcome], sim: Sequence[Outcome]
) -> list[dict[str, Any]]:
    """Each request on both sides (the first live repeat): where the differences are."""
    return [
        {
            "index": sp.index, "arrival_s": round(sp.arrival_s, 4),
            "prompt_tokens": sp.num_prompt_tokens,
            "live": {"ttft_s": a.ttft_s, "offloaded": a.offloaded, "cached": a.num_cached_tokens,
                     "finish_s": a.finish_s, "reason": a.reason, "attempts": a.attempts},
            "sim": {"ttft_s": b.ttft_s, "offloaded": b.offloaded, "cached": b.num_cached_tokens,
                    "finish_s": b.finish_s},
        }
        for sp, a, b in zip(specs, live, sim, strict=True)
    ]  # fmt: skip


def _fmt(v: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def _pair(r: dict[str, Any], key: str, fmt: str = "{:.3f}") -> str:
    """``live / sim (sim/live)`` of one figure."""
    live, sim, ratio = r["live"][key], r["sim"][key], r["ratio"].get(key)
    tail = "" if key not in r["ratio"] else f" ({_fmt(ratio, '{:.2f}')})"
    return f"{_fmt(live, fmt)} / {_fmt(sim, fmt)}{tail}"


def render(rows: Sequence[dict[str, Any]]) -> str:
    cols = (
        "scenario", "load", "offered rps", "completed live/sim",
        "throughput rps live / sim (sim/live)", "TTFT P50 s live / sim (sim/live)",
        "TTFT P90 s live / sim (sim/live)", "offloaded live/sim", "same route",
        "prefix hit live / sim",
    )  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        ra = r["route_agreement"]
        cells = (
            r["scenario"], r["load"], f"{r['offered_rps']:.2f}",
            _pair(r, "completed", "{:.0f}"), _pair(r, "throughput_rps"),
            _pair(r, "ttft_p50_s"), _pair(r, "ttft_p90_s"), _pair(r, "offloaded", "{:.0f}"),
            f"{_fmt(ra['agree'], '{:.0f}')}/{_fmt(ra['compared'], '{:.0f}')}",
            _pair(r, "prefix_hit_rate_all", "{:.1%}"),
        )  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _read_share(path: Path) -> float | None:
    return float(path.read_text()) if path.is_file() else None


def machine_load() -> dict[str, Any]:
    load1, load5, load15 = os.getloadavg()
    return {"loadavg_1_5_15": [load1, load5, load15], "cpus": os.cpu_count()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--workdir", type=Path, default=Path("/tmp/prfaas-fidelity"),
        help="model, profiles, deployment file and logs (reused if present)",
    )  # fmt: skip
    p.add_argument("--json", type=Path, help="write every figure to this file")
    p.add_argument("--quick", action="store_true", help="a handful of requests, one load")
    p.add_argument("--repeats", type=int, default=1, help="live runs per point (medians)")
    p.add_argument(
        "--loads", type=float, nargs="*",
        help="fractions of the measured capacity (none: the capacity runs only)",
    )  # fmt: skip
    p.add_argument("--overload", type=float, help="capacity runs: x the simulator's capacity")
    p.add_argument("--trace-requests", type=int)
    p.add_argument("--trace-offset", type=int, help="first trace row of the slice")
    p.add_argument("--burst-requests", type=int)
    p.add_argument("--scenarios", nargs="+", choices=["trace", "burst"])
    p.add_argument("--threshold-tokens", type=int, help="the router's t [balanced_t]")
    p.add_argument("--fresh-profiles", action="store_true", help="profile again even if present")
    args = p.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the Launcher's ``with`` stops every process it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    fields: dict[str, Any] = dict(QUICK) if args.quick else {}
    for name in ("repeats", "overload", "trace_requests", "trace_offset", "burst_requests",
                 "threshold_tokens"):  # fmt: skip
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    if args.loads is not None:
        fields["loads"] = tuple(args.loads)
    if args.scenarios:
        fields["scenarios"] = tuple(args.scenarios)
    s = Settings(workdir=args.workdir, **fields)
    s.workdir.mkdir(parents=True, exist_ok=True)
    load_before = machine_load()
    say(f"machine load before: {load_before['loadavg_1_5_15']}")

    model = make_model(s.workdir)
    profiles = {
        "prfaas": s.workdir / f"prfaas-core{PRFAAS_CORE}.yaml",
        "pd": s.workdir / f"pd-core{PD_CORE}.yaml",
    }
    if args.fresh_profiles:
        for path in profiles.values():
            path.unlink(missing_ok=True)
    profile_cores(model, {PRFAAS_CORE: profiles["prfaas"], PD_CORE: profiles["pd"]}, s)

    from prfaas.perf.profile_costs import cost_model_from_profile_file

    remote_cm = cost_model_from_profile_file(profiles["prfaas"])
    local_cm = cost_model_from_profile_file(profiles["pd"])
    workloads = {"trace": trace_specs, "burst": burst_specs}
    base = {name: workloads[name](s) for name in s.scenarios}
    t = s.threshold_tokens
    if t is None:
        t = balanced_t([sp for specs in base.values() for sp in specs], remote_cm, local_cm)
    deployment = write_deployment(s.workdir, model, t, s)
    say(f"deployment {deployment} (router prfaas, t = {t} tokens)")

    rows: list[dict[str, Any]] = []
    runs = iter(range(1, 10_000))

    def report() -> dict[str, Any]:
        return {
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items()},
            "threshold_tokens": t,
            "deployment": str(deployment),
            "profiles": {k: str(v) for k, v in profiles.items()},
            "machine": {"before": load_before, "now": machine_load(), "host": platform.node()},
            "profile_core_share": _read_share(s.workdir / "profile-core-share.txt"),
            "rows": rows,
        }

    def point(name: str, label: str, rate: float, specs: list[Any]) -> dict[str, Any]:
        live_runs = []
        for rep in range(s.repeats):
            say(f"{name} {label} ({rate:.3f} rps): live run {rep + 1}/{s.repeats}")
            live_runs.append(run_live(deployment, specs, s.workdir / f"run{next(runs)}"))
        sim = run_sim(deployment, specs)
        row = compare_row(name, label, rate, live_runs, sim)
        row["requests"] = per_request(specs, live_runs[0], sim)
        # Work per node: the cost model's busy seconds against the CPU seconds the live process
        # used (last repeat); their ratio is how far the profile's speed is from the run's.
        row["node_work_s"] = {
            n: {"sim_busy": LAST_SIM_BUSY_S.get(SIM_NODE[n]), "live_cpu": LAST_LIVE_CPU_S.get(n)}
            for n in NODES
        }
        rows.append(row)
        say(f"{name} {label}: {render([row]).splitlines()[-1]}")
        if args.json:  # after every point: a run cut short keeps what it measured
            args.json.write_text(json.dumps(report(), indent=2))
        return row

    for name, specs in base.items():
        # Capacity: the same requests arriving faster than they can be served.
        sim_capacity = summarize(run_sim(deployment, at_rate(specs, 1000.0)))["throughput_rps"]
        rate = s.overload * sim_capacity
        row = point(name, "capacity", rate, at_rate(specs, rate))
        capacity = row["live"]["throughput_rps"]
        row["saturated"] = capacity < 0.9 * rate  # else the run only shows the arrival rate
        if not row["saturated"]:
            say(f"{name}: the live side kept up with {rate:.3f} rps: capacity is more than that")
        for load in s.loads:
            point(name, f"{load:.0%}", load * capacity, at_rate(specs, load * capacity))
    say(f"machine load after: {machine_load()['loadavg_1_5_15']}")
    print(render(rows))
    if args.json:
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
