"""Fair sharing of a pool of TORCH nodes, live against the pool simulator (issue 21, must-hold (a)
and (c) on real models; no bound this round: the figures are reported).

    flock /tmp/prfaas-heavy.lock .venv/bin/python bench/pool_torch.py            # ~8 min
    flock /tmp/prfaas-heavy.lock .venv/bin/python bench/pool_torch.py --quick    # ~2-3 min
    .venv/bin/python bench/pool_torch.py --sim-only --profile FILE --model-path DIR   # no live

Steps, all from this script:
1. A tiny random-weight Qwen3-Next (``make_tiny``, the fidelity bench's) and its profile file
   (``prfaas profile --engine torch`` under ``taskset -c POOL_CORE``: forward passes, then the
   plumbing terms through a live one-site deployment), unless ``--profile FILE`` is given.
2. One pool file (one torch group of ``--pool-nodes`` nodes, ``hardware:`` the profile file) and
   two tenant files (weights 2:1, the same fixed-length prompts, Poisson rate, cap and link;
   each a torch PD site, prefill + decode node pinned to ``PD_CORE`` by ``engine.cpus``,
   ``hardware:`` the profile file, ``router: threshold`` with a fixed ``t`` under the prompt
   length, so every request is offered to the pool). Written once: the live run and the
   simulator read the very same files. The pool's group has ``cpus: POOL_CORE``: its node
   process pins itself there (every thread, as a deployment's node process does), and this script
   puts itself, the front door and the gateways on the other cores (with the PD sites), so the
   pool node has its core to itself as the simulated node has its instance; the
   tenants' local prefill nodes run at ``--local-nice`` (the over-offered fallback prefills would
   otherwise starve the gateways, decode nodes and front door; local prefill is not measured).
3. Live: ``prfaas up pool.yaml`` and both tenants (``serve.launcher.Launcher``, as the e2e tests),
   two warm-up requests per tenant, then open-loop Poisson load per tenant at ``--load`` times
   the pool's simulated capacity (the arrival times the simulator draws: same spec, same seed),
   tenant a stopping at ``--stop-a`` (must-hold (c)). Meanwhile the pool's operator listener is
   sampled: ``/internal/tenants`` (placed, done, accepted per tenant) and ``/internal/nodes``
   (which tenant each pool node runs). Afterwards each tenant's route log and ``/metrics``.
4. ``prfaas sim pool.yaml tenant-a.yaml tenant-b.yaml`` (its Python API: ``build_pool_scenario``,
   once per measurement window) and the figures side by side: per-tenant compute share, egress
   share, offloaded, completed; the a:b ratios live and simulated; which of the profile's
   plumbing terms the pool simulator charges (``PLUMBING_IN_POOL_SIM``: the pool node's and the
   tenants' prefill nodes' per-request terms and the gateways'; no decode term).

Live shares over a window [lo, hi] (seconds from the load's start):
- compute (priced): prefills placed in the window x ``prefill_node_s(L)`` (the profile's
  ``prefill_s(L)`` + its ``prefill_per_request_s``: what the live door prices a prefill and the
  simulator runs a pool node for) / (nodes x span), the simulator's measure;
- compute (occupied): the share of samples in which a pool node ran the tenant's prefill (real
  node time, plumbing and KV streaming included);
- egress: prefills done in the window x the mean KV bytes of the tenant's offloads (its route
  log) / (egress x span).
Every process started here is stopped on exit, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MODEL_NAME = "tiny-pool"
"""The model folder's name: ``prfaas profile`` records it as the model name, and the pool group's
``model`` and each tenant's ``engine.model`` must match it for the profile file to price them."""
MODEL_OVERRIDES: dict[str, Any] = {"max_position_embeddings": 16384}
BLOCK_TOKENS = 512
PROFILE_SEED = 7919
GROUP = "g-torch"
TENANTS = ("tenant-a", "tenant-b")
KEYS = {
    "tenant-a": ("a-1", "PRFAAS_POOL_KEY_A", "pool-torch-bench-key-a-0123456789abcdef"),
    "tenant-b": ("b-1", "PRFAAS_POOL_KEY_B", "pool-torch-bench-key-b-0123456789abcdef"),
}
PLUMBING_IN_POOL_SIM = {
    # term: (charged by the pool simulator?, where)
    "prefill_per_request_s": (
        True,
        "the pool node's (the group's profile) in each pool prefill's compute_s = "
        "policy.pool_admission.prefill_node_s(n), the price the live door charges too "
        "(pool/service.py); the tenant's local prefill node's (its PD site's profile) in each "
        "local prefill's time (PoolSimulator._start_local)",
    ),
    "prefill_per_token_s": (
        True,
        "with prefill_per_request_s, per uncached token (plumbing.prefill_overhead_s): in each "
        "pool prefill's compute_s and each local prefill's time",
    ),
    "prefill_in_service_excess": (
        True,
        "with prefill_per_request_s, on the passes' seconds (plumbing.prefill_overhead_s): in "
        "each pool prefill's compute_s and each local prefill's time",
    ),
    "decode_per_request_s": (
        False,
        "nowhere: the pool simulator models no decode (its TTFT ends when the last KV byte "
        "reaches the tenant, PoolSimulator._settle_egress -> _finish)",
    ),
    "decode_per_kv_byte_s": (False, "nowhere: no decode is modelled (its install would go there)"),
    "decode_per_step_s": (False, "nowhere: no decode is modelled (sim/pool_sim.py docstring)"),
    "decode_per_output_token_s": (False, "nowhere: no decode is modelled"),
    "decode_per_context_token_s": (False, "nowhere: no decode is modelled"),
    "gateway_per_request_s": (
        True,
        "a sim.plumbing.GatewayCpu per tenant (its PD site's profile): each arrival is routed "
        "at its route_at(arrival), as sim/simulator.py does (PoolSimulator._next_arrival)",
    ),
    "gateway_per_output_token_s": (
        True,
        "booked on the same GatewayCpu, but the pool simulator has no output tokens: it "
        "changes nothing (the relay never holds a routing back, in either simulator)",
    ),
    "shared_core_overhead": (
        False,
        "nowhere: every simulated pool and local node has a core of its own (no SharedCores)",
    ),
}


POOL_SIM_SOURCES = (
    "sim/pool_sim.py", "sim/pool_egress.py", "sim/pool_scenario.py", "sim/pool_tuning.py",
    "sim/pool_report.py", "commands/sim_pool.py",
)  # fmt: skip


def node_s(cost: Any, num_tokens: int) -> float:
    """One pool prefill's node-seconds: the price the door charges, the time the simulator runs
    a pool node for (``policy.pool_admission.prefill_node_s``)."""
    from prfaas.policy.pool_admission import prefill_node_s

    return prefill_node_s(cost, num_tokens)


def pool_sim_mentions() -> set[str]:
    """The plumbing terms (or ``plumbing`` itself) the pool simulator's sources name today (a
    term the table says is charged and no source names means the table is stale)."""
    import prfaas

    base = Path(prfaas.__file__).parent
    words = {*PLUMBING_IN_POOL_SIM, "plumbing"}
    found: set[str] = set()
    for rel in POOL_SIM_SOURCES:
        with contextlib.suppress(OSError):
            text = (base / rel).read_text()
            found |= {w for w in words if w in text}
    return found


@dataclass(frozen=True, slots=True)
class Settings:
    workdir: Path
    prompt_tokens: int = 4096
    output_tokens: int = 4
    duration_s: float = 180.0
    """Seconds of tenant b's arrivals (the run's length)."""
    stop_a_s: float | None = 120.0
    """Tenant a's arrivals end here (must-hold (c)); None: it runs the whole time."""
    warmup_s: float = 15.0
    settle_s: float = 10.0
    """After a stops, this long before b's window (a's queued prefills finish meanwhile)."""
    load: float = 1.1
    """Each tenant's rate, in units of the pool's simulated capacity (nodes / prefill_node_s(L)):
    over
    1, so that each tenant alone offers more than the pool serves (must-hold (c) needs b to)."""
    pool_nodes: int = 1
    queue_prefills: int = 6
    """Each tenant's cap (``max_queued_tokens``) in prompts of L: beyond it the pool refuses and
    the tenant prefills at home (both live and simulated)."""
    egress_gbps: float = 1.0
    link_gbps: float = 1.0
    threshold_tokens: int = 256
    pool_core: int = 1
    pd_core: int = 0
    seed: int = 1
    local_nice: int = 10
    """The tenants' local prefill nodes (``p0``) run at this nice: the over-offered fallback
    prefills must not starve the gateways, decode nodes and front door beside them (0: as is)."""
    drain_s: float = 45.0
    """After the last arrival, how long in-flight requests may take before they are cancelled."""
    profile_new_tokens: tuple[int, ...] = (512, 2048, 4096)
    profile_batches: tuple[int, ...] = (1, 2, 4)
    profile_contexts: tuple[int, ...] = (512, 4096)
    profile_repeats: int = 3
    plumbing_requests: int = 8
    node_sample_hz: float = 5.0


QUICK: dict[str, Any] = {
    "duration_s": 55.0,
    "stop_a_s": 38.0,
    "warmup_s": 6.0,
    "settle_s": 5.0,
    "drain_s": 20.0,
    "profile_new_tokens": (512, 4096),
    "profile_batches": (1, 2),
    "profile_repeats": 1,
    "plumbing_requests": 2,
}


def say(msg: str) -> None:
    print(f"[pool_torch {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _raise_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through every finally: processes are stopped


# -- 1. the model and its profile ----------------------------------------------------------------
def make_model(workdir: Path, name: str = MODEL_NAME) -> Path:
    out = workdir / name
    if (out / "config.json").is_file():
        return out
    from prfaas.engine.torch.tiny import make_tiny

    say(f"making the model in {out}")
    return make_tiny("qwen3_next", out, overrides=MODEL_OVERRIDES)


def profile_command(model: Path, out: Path, s: Settings) -> list[str]:
    return [
        "taskset", "-c", str(s.pool_core), sys.executable, "-m", "prfaas.cli", "profile",
        "--engine", "torch", "--model-path", str(model), "-o", str(out),
        "--hardware", f"cpu-core{s.pool_core}", "--seed", str(PROFILE_SEED),
        "--pass-tokens", str(BLOCK_TOKENS),
        "--repeats", str(s.profile_repeats), "--plumbing-requests", str(s.plumbing_requests),
        "--new-tokens", *map(str, s.profile_new_tokens),
        "--cached-tokens", "0",
        "--batch-sizes", *map(str, s.profile_batches),
        "--contexts", *map(str, s.profile_contexts),
    ]  # fmt: skip


def profile(model: Path, out: Path, s: Settings) -> None:
    cmd = profile_command(model, out, s)
    say("profiling: " + " ".join(cmd))
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=1800)
    finally:  # interrupted: no profile left running
        _kill_group(proc)
    if proc.returncode != 0:
        raise SystemExit(f"prfaas profile failed ({proc.returncode}):\n{stderr[-3000:]}")
    for line in stdout.splitlines():
        say(f"  profile: {line.rstrip()}")


def profile_model_name(path: Path) -> str:
    doc = yaml.safe_load(path.read_text())
    return str(doc["model"]["name"])


# -- 2. the files --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Files:
    pool: Path
    tenants: dict[str, Path]
    front_door_port: int
    control_port: int


def write_files(workdir: Path, model: Path, prof: Path, s: Settings, rate_rps: float) -> Files:
    from prfaas.serve.launch_resolved import free_port

    name = model.name
    door, control = free_port(), free_port()
    queued = s.queue_prefills * s.prompt_tokens
    processes = ", processes: per_node" if s.pool_nodes > 1 else ""
    pool = {
        "version": 1,
        # Torch nodes compute in real time and send real bytes: the door's clock and the units
        # are wall seconds and real bytes.
        "units": {"time_scale": 1.0, "byte_divisor": 1, "block_tokens": BLOCK_TOKENS},
        "front_door": {"host": "127.0.0.1", "port": door, "control_port": control},
        "egress_gbps": s.egress_gbps,
        "heartbeat_interval_s": 0.5,
        "lease_s": 30.0,
        "groups": [{
            "name": GROUP, "model": name, "kind": "torch", "model_path": str(model),
            "hardware": str(prof), "num_nodes": s.pool_nodes, "cpus": str(s.pool_core),
        }],
        "tenants": [
            {"name": t, "weight": w, "cap": {"max_queued_tokens": queued},
             "keys": [{"id": KEYS[t][0], "env": KEYS[t][1]}]}
            for t, w in zip(TENANTS, (2, 1), strict=True)
        ],
    }  # fmt: skip
    if processes:
        pool["groups"][0]["processes"] = "per_node"
    pool_path = workdir / "pool.yaml"
    header = "# Written by bench/pool_torch.py: the pool it runs live and simulates.\n"
    pool_path.write_text(header + yaml.safe_dump(pool, sort_keys=False))
    tenants = {}
    for i, t in enumerate(TENANTS):
        dur = s.stop_a_s if (t == "tenant-a" and s.stop_a_s is not None) else s.duration_s
        doc = {
            "engine": {
                "kind": "torch", "model": name, "model_path": str(model),
                "block_tokens": BLOCK_TOKENS, "time_scale": 1.0, "byte_divisor": 1, "threads": 1,
            },
            "gateway": {"port": free_port(), "control_port": free_port(),
                        "request_timeout_s": 600, "max_inflight": 1024, "max_queued": 4096,
                        "route_log_size": 100000},
            "policy": {"router": "threshold", "threshold_tokens": s.threshold_tokens},
            "sites": [{
                "name": "pd", "kind": "pd", "hardware": str(prof),
                "engine": {"cpus": str(s.pd_core)},
                "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}],
            }],
            "pool": {
                "url": f"http://127.0.0.1:{door}", "tenant": t,
                "key": {"id": KEYS[t][0], "env": KEYS[t][1]},
                "link": {"gbps": s.link_gbps, "rtt_ms": 0}, "tuner": "fixed",
            },
            "workload": {
                "arrival": {"kind": "poisson", "rate_rps": rate_rps},
                "lengths": {"kind": "fixed", "fixed_tokens": s.prompt_tokens},
                "output_tokens": s.output_tokens,
                "duration_s": dur, "warmup_s": s.warmup_s, "seed": s.seed + i,
            },
        }  # fmt: skip
        path = workdir / f"{t}.yaml"
        path.write_text(
            f"# Written by bench/pool_torch.py: {t}, live and simulated.\n"
            + yaml.safe_dump(doc, sort_keys=False)
        )
        tenants[t] = path
    return Files(pool_path, tenants, door, control)


def windows(s: Settings) -> dict[str, tuple[float, float]]:
    """(a): both offered, [warmup, a's stop]; (c): b alone, [a's stop + settle, the end]."""
    if s.stop_a_s is None:
        return {"a": (s.warmup_s, s.duration_s)}
    return {"a": (s.warmup_s, s.stop_a_s), "c": (s.stop_a_s + s.settle_s, s.duration_s)}


# -- 3. the simulator ----------------------------------------------------------------------------
def simulate(files: Files, s: Settings) -> dict[str, Any]:
    """``prfaas sim POOL TENANT...`` once per window (the summary measures one window)."""
    from prfaas.commands.sim_pool import build_pool_scenario
    from prfaas.sim.pool_report import pool_summary
    from prfaas.sim.pool_sim import PoolSimulator

    paths = [files.tenants[t] for t in TENANTS]
    base = build_pool_scenario(files.pool, paths)
    out: dict[str, Any] = {}
    for key, (lo, hi) in windows(s).items():
        sim = PoolSimulator(replace(base, measure_from_s=lo, measure_to_s=hi))
        sim.run()
        out[key] = pool_summary(sim)
    return out


# -- 4. live -------------------------------------------------------------------------------------
def _kill_group(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


class LivePool:
    """``prfaas up pool.yaml`` in its own process group; ``stop`` is SIGTERM then SIGKILL."""

    def __init__(self, files: Files, workdir: Path) -> None:
        self.files = files
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{files.front_door_port}"
        self.control_url = f"http://127.0.0.1:{files.control_port}"

    def start(self, ready_timeout_s: float = 180.0) -> None:
        cmd = [sys.executable, "-m", "prfaas.cli", "up", str(self.files.pool),
               "--workdir", str(self.workdir), "--ready-timeout", str(ready_timeout_s)]  # fmt: skip
        say("pool: " + " ".join(cmd))
        out = self.workdir.parent / "pool-up.out"
        with out.open("wb") as sink:
            self.proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + ready_timeout_s + 15
        while b"ready:" not in out.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the pool did not come up:\n" + out.read_text(errors="replace"))
            time.sleep(0.3)

    @property
    def internal_key(self) -> str:
        return (self.workdir / "pool-internal.key").read_text().strip()

    def node_pids(self) -> list[int]:
        doc = json.loads((self.workdir / "processes.json").read_text())
        return [int(p["pid"]) for p in doc["processes"] if p["name"] != "frontdoor" and p["pid"]]

    def stop(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc)

    def log_tail(self) -> str:
        return "\n".join(
            f"== {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
            for p in sorted(self.workdir.glob("*.log"))
        )


def cpu_seconds(pid: int) -> float:
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return float("nan")


def core_ticks() -> dict[int, tuple[int, int]]:
    """Per core: (busy, total) jiffies from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        m = re.match(r"^cpu(\d+) (.*)$", line)
        if m:
            v = [int(x) for x in m.group(2).split()]
            idle = v[3] + (v[4] if len(v) > 4 else 0)
            out[int(m.group(1))] = (sum(v[:8]) - idle, sum(v[:8]))
    return out


def core_busy(before: dict[int, tuple[int, int]]) -> dict[int, float]:
    after = core_ticks()
    return {
        c: (after[c][0] - b[0]) / max(1, after[c][1] - b[1])
        for c, b in before.items()
        if c in after
    }


def renice(pid: int, nice: int) -> None:
    """Every thread of ``pid`` at ``nice`` (on Linux a nice value is per thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


@dataclass(slots=True)
class Sent:
    tenant: str
    at_s: float
    status: int = 0
    done_s: float | None = None
    response_id: str = ""
    error: str = ""


@dataclass(slots=True)
class Samples:
    tenants: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    nodes: list[tuple[float, list[dict[str, Any]]]] = field(default_factory=list)


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]


async def _drive(
    urls: dict[str, str],
    model: str,
    pool: LivePool,
    s: Settings,
    rate_rps: float,
    vocab: int,
) -> tuple[float, list[Sent], Samples]:
    import httpx

    from prfaas.serve.auth import SignedAuth
    from prfaas.workload import ArrivalSpec, arrival_times

    sent: list[Sent] = []
    samples = Samples()
    limits = httpx.Limits(max_connections=2048, max_keepalive_connections=256)
    timeout = httpx.Timeout(s.duration_s + s.drain_s + 60, connect=10)
    async with (
        httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client,
        httpx.AsyncClient(auth=SignedAuth(pool.internal_key.encode()), timeout=5,
                          trust_env=False) as operator,
    ):  # fmt: skip

        async def one(tenant: str, prompt: list[int], rec: Sent, t0: float) -> None:
            body = {"model": model, "prompt": prompt, "max_tokens": s.output_tokens,
                    "temperature": 0, "ignore_eos": True}  # fmt: skip
            try:
                r = await client.post(f"{urls[tenant]}/v1/completions", json=body)
                rec.status = r.status_code
                if r.status_code == 200:
                    rec.response_id = str(r.json().get("id", ""))
                else:
                    rec.error = r.text[:200]
            except asyncio.CancelledError:
                rec.error = "cancelled (drain time over)"
                raise
            except Exception as exc:
                rec.error = f"{type(exc).__name__}: {exc}"[:200]
            finally:
                rec.done_s = time.monotonic() - t0

        # Warm-up: two requests per tenant, one after the other (first calls load kernels).
        warm_rng = random.Random(s.seed + 1000)
        for t in TENANTS:
            for _ in range(2):
                rec = Sent(t, 0.0)
                await one(t, _prompt(warm_rng, s.prompt_tokens, vocab), rec, time.monotonic())
                if rec.status != 200:
                    raise SystemExit(f"warm-up request of {t} failed: {rec.status} {rec.error}")
        say("warm-up done (2 requests per tenant)")

        async def sample(t0: float, stop: asyncio.Event) -> None:
            every = 1.0 / s.node_sample_hz
            last_tenants = -1.0
            while not stop.is_set():
                now = time.monotonic() - t0
                with contextlib.suppress(Exception):
                    r = await operator.get(f"{pool.control_url}/internal/nodes")
                    samples.nodes.append((now, r.json()))
                if now - last_tenants >= 0.5:
                    with contextlib.suppress(Exception):
                        r = await operator.get(f"{pool.control_url}/internal/tenants")
                        samples.tenants.append((time.monotonic() - t0, r.json()["tenants"]))
                        last_tenants = now
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), every)

        async def tenant_load(tenant: str, seed: int, dur: float, t0: float) -> list[Any]:
            rng = random.Random(seed)  # the simulator's: PoolSimulator draws the same times
            times = list(arrival_times(ArrivalSpec("poisson", rate_rps), dur, rng))
            prompts = random.Random(seed * 7919 + 17)
            tasks = []
            for at in times:
                delay = at - (time.monotonic() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                rec = Sent(tenant, at)
                sent.append(rec)
                prompt = _prompt(prompts, s.prompt_tokens, vocab)
                tasks.append(asyncio.create_task(one(tenant, prompt, rec, t0)))
            say(f"{tenant}: {len(times)} requests sent over {dur:.0f} s")
            return tasks

        # The simulator's tenants: seeds s.seed + i, tenant a until stop_a_s.
        t0 = time.monotonic()
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample(t0, stop))
        progress = asyncio.create_task(_progress(t0, s, sent))
        loads = [
            tenant_load(t, s.seed + i,
                        s.stop_a_s if (t == "tenant-a" and s.stop_a_s is not None)
                        else s.duration_s, t0)
            for i, t in enumerate(TENANTS)
        ]  # fmt: skip
        task_lists = await asyncio.gather(*loads)
        tasks = [x for lst in task_lists for x in lst]
        left = max(1.0, s.duration_s + s.drain_s - (time.monotonic() - t0))
        _, pending = await asyncio.wait(tasks, timeout=left) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        if pending:
            say(f"{len(pending)} requests still running after the drain time: cancelled")
            await asyncio.gather(*pending, return_exceptions=True)
        stop.set()
        progress.cancel()
        await sampler
        with contextlib.suppress(asyncio.CancelledError):
            await progress
    return t0, sent, samples


async def _progress(t0: float, s: Settings, sent: list[Sent]) -> None:
    while True:
        await asyncio.sleep(15)
        now = time.monotonic() - t0
        done = sum(1 for r in sent if r.done_s is not None)
        ok = sum(1 for r in sent if r.status == 200)
        say(f"t={now:5.0f}/{s.duration_s:.0f} s: {len(sent)} sent, {done} ended ({ok} ok); "
            f"load {os.getloadavg()[0]:.2f}")  # fmt: skip


def _metric(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(\w+)=\"([^\"]*)\"\}} ([0-9.eE+-]+)$", line)
        if m:
            out[m.group(2)] = float(m.group(3))
    return out


def run_live(files: Files, model: Path, s: Settings, rate_rps: float) -> dict[str, Any]:
    import httpx

    from prfaas.config import load_deployment
    from prfaas.serve.launcher import Launcher

    vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
    for t in TENANTS:
        os.environ[KEYS[t][1]] = KEYS[t][2]  # the pool's and the tenants' processes read them
    live_dir = s.workdir / "live"
    live_dir.mkdir(parents=True, exist_ok=True)
    pool = LivePool(files, live_dir / "pool-wd")
    lives: dict[str, Launcher] = {}
    load_before = os.getloadavg()
    # This process and everything it starts (front door, gateways; the tenants' torch nodes pin
    # themselves to engine.cpus, the pool's node to its group's cpus) on the cores other than the
    # pool node's: the pool node gets its core to itself, as the simulator's pool node has its
    # instance.
    allowed = os.sched_getaffinity(0)
    rest = allowed - {s.pool_core}
    if rest:
        os.sched_setaffinity(0, rest)
    try:
        started = time.monotonic()
        pool.start()
        node_pids = pool.node_pids()
        pinned = {pid: sorted(os.sched_getaffinity(pid)) for pid in node_pids}
        say(f"pool up in {time.monotonic() - started:.0f} s; node process(es) on cores {pinned} "
            f"(the group's cpus: {s.pool_core})")  # fmt: skip
        for t in TENANTS:
            live = Launcher(load_deployment(files.tenants[t]), live_dir / f"{t}-wd")
            lives[t] = live
            live.start(ready_timeout_s=240, progress=lambda m, t=t: say(f"{t}: {m}"))
        deadline = time.monotonic() + 60
        for t, live in lives.items():
            while not any(n["node"] == "pool" and n.get("in_rotation") for n in live.nodes()):
                if time.monotonic() > deadline:
                    raise SystemExit(f"{t}: the pool never came into rotation")
                time.sleep(0.2)
        if s.local_nice:
            for live in lives.values():
                renice(live.child("p0").proc.pid, s.local_nice)
        say(
            f"everything up in {time.monotonic() - started:.0f} s; load {os.getloadavg()[0]:.2f}; "
            f"others on cores {sorted(rest)}; local prefill nodes at nice {s.local_nice}"
        )
        ticks = core_ticks()
        cpu0 = {pid: cpu_seconds(pid) for pid in node_pids}
        urls = {t: live.url for t, live in lives.items()}
        wall0 = time.monotonic()
        t0, sent, samples = asyncio.run(_drive(urls, model.name, pool, s, rate_rps, vocab))
        wall = time.monotonic() - wall0
        cpu = {pid: cpu_seconds(pid) - c for pid, c in cpu0.items()}
        busy = core_busy(ticks)
        routes = {t: live.routes() for t, live in lives.items()}
        metrics = {}
        for t, live in lives.items():
            text = httpx.get(f"{live.url}/metrics", timeout=10, trust_env=False).text
            metrics[t] = {
                "offloads": _metric(text, "prfaas_pool_offloads_total"),
                "fallbacks": _metric(text, "prfaas_pool_fallbacks_total"),
            }
        load_after = os.getloadavg()
    except BaseException:
        with contextlib.suppress(Exception):
            say("failed; the pool's logs:\n" + pool.log_tail())
        raise
    finally:
        for t, live in reversed(list(lives.items())):
            say(f"stopping {t}")
            with contextlib.suppress(Exception):
                live.stop()
        say("stopping the pool")
        pool.stop()
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, allowed)
    return {
        "sent": sent,
        "samples": samples,
        "routes": routes,
        "metrics": metrics,
        "node_cpu_share": {str(p): c / wall for p, c in cpu.items()},
        "core_busy": busy,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "t0": t0,
    }


# -- 5. the figures ------------------------------------------------------------------------------
def _at(samples: list[tuple[float, dict[str, Any]]], t: float) -> dict[str, Any]:
    """The last counters sampled at or before ``t`` (the first if none)."""
    best = samples[0][1]
    for at, row in samples:
        if at > t:
            break
        best = row
    return best


def live_figures(live: dict[str, Any], cost: Any, s: Settings) -> dict[str, Any]:
    samples: Samples = live["samples"]
    egress_bps = s.egress_gbps * 1e9 / 8
    kv_mean: dict[str, float] = {}
    for t in TENANTS:
        off = [r["kv_bytes"] for r in live["routes"][t] if r.get("offloaded")]
        kv_mean[t] = sum(off) / len(off) if off else float(cost.kv_bytes(s.prompt_tokens))
    prefill_s = node_s(cost, s.prompt_tokens)
    out: dict[str, Any] = {"windows": {}, "kv_bytes_mean": kv_mean}
    for key, (lo, hi) in windows(s).items():
        span = hi - lo
        a, b = _at(samples.tenants, lo), _at(samples.tenants, hi)
        w: dict[str, Any] = {"from": lo, "to": hi, "tenants": {}}
        busy = {t: 0 for t in TENANTS}
        num = 0
        for at, nodes in samples.nodes:
            if lo <= at <= hi:
                num += len(nodes)
                for n in nodes:
                    tenant = n.get("running", "").split("/")[0]
                    if tenant in busy:
                        busy[tenant] += 1
        for t in TENANTS:
            placed = b[t]["placed"] - a[t]["placed"]
            done = b[t]["done"] - a[t]["done"]
            w["tenants"][t] = {
                "placed": placed,
                "done": done,
                "compute_priced": placed * prefill_s / (s.pool_nodes * span),
                "compute_occupied": busy[t] / num if num else float("nan"),
                "egress": done * kv_mean[t] / (egress_bps * span),
            }
        out["windows"][key] = w
    first, last = samples.tenants[0][1], samples.tenants[-1][1]
    out["pool"] = {
        t: {k: last[t][k] - first[t][k] for k in ("accepted", "placed", "done", "failed",
                                                  "aborted")}
        for t in TENANTS
    }  # fmt: skip
    per: dict[str, Any] = {}
    for t in TENANTS:
        recs = [r for r in live["sent"] if r.tenant == t]
        ok = {r.response_id for r in recs if r.status == 200}
        routes = [r for r in live["routes"][t] if r["request_id"] in ok]
        errors: dict[str, int] = {}
        for r in recs:
            if r.status != 200:
                key = str(r.status) if r.status else r.error.split(":")[0]
                errors[key] = errors.get(key, 0) + 1
        per[t] = {
            "arrived": len(recs),
            "completed": len(ok),
            "offloaded_done": sum(1 for r in routes if r.get("offloaded")),
            "local": sum(1 for r in routes if not r.get("offloaded")),
            "errors": errors,
            "gateway_offloads": live["metrics"][t]["offloads"],
            "gateway_fallbacks": live["metrics"][t]["fallbacks"],
        }
    out["requests"] = per
    return out


def _ratio(x: float, y: float) -> float:
    return x / y if y > 0 else float("inf")


def report(files: Files, sim: dict[str, Any], live: dict[str, Any] | None, cost: Any,
           s: Settings, rate_rps: float) -> dict[str, Any]:  # fmt: skip
    lf = live_figures(live, cost, s) if live is not None else None
    paths = " ".join(str(p) for p in (files.pool, *files.tenants.values()))
    print(f"\nfiles: {paths}")
    print(f"simulated: prfaas sim {paths} --json  (here once per window, measure_from/to set)")
    print(f"prompt {s.prompt_tokens} tokens, {s.output_tokens} out; each tenant Poisson "
          f"{rate_rps:.3f} rps = {s.load:.2f} x the pool's simulated capacity "
          f"({s.pool_nodes} node(s) / prefill_node_s {node_s(cost, s.prompt_tokens):.4f} s); "
          f"cap {s.queue_prefills} prompts queued per tenant; egress {s.egress_gbps} Gbps, "
          f"links {s.link_gbps} Gbps; weights 2:1")  # fmt: skip
    rows: list[tuple[str, str, str]] = []
    for key, (lo, hi) in windows(s).items():
        title = ("(a) both tenants offered, weights 2:1" if key == "a"
                 else "(c) tenant a stopped: b alone")  # fmt: skip
        print(f"\n== {title}: window [{lo:g}, {hi:g}] s")
        sm = sim[key]["tenants"]
        lw = lf["windows"][key]["tenants"] if lf else None
        print(f"{'':34}{'live':>12}{'sim':>12}")

        def row(label: str, lv: float | None, sv: float, key: str = key) -> None:
            lv_s = "-" if lv is None else f"{lv:.4f}"
            print(f"{label:34}{lv_s:>12}{sv:>12.4f}")
            rows.append((f"{key}: {label}", lv_s, f"{sv:.4f}"))

        for t in TENANTS:
            row(f"compute share {t} (priced)", lw[t]["compute_priced"] if lw else None,
                sm[t]["compute_share"][GROUP])  # fmt: skip
        if lw:
            for t in TENANTS:
                row(f"compute share {t} (occupied)", lw[t]["compute_occupied"], float("nan"))
        for t in TENANTS:
            row(f"egress share {t}", lw[t]["egress"] if lw else None, sm[t]["egress_share"])
        if key == "a":
            sa, sb = sm["tenant-a"], sm["tenant-b"]
            row("compute a/b (priced; promise 2)",
                _ratio(lw["tenant-a"]["compute_priced"], lw["tenant-b"]["compute_priced"])
                if lw else None,
                _ratio(sa["compute_share"][GROUP], sb["compute_share"][GROUP]))  # fmt: skip
            if lw:
                row("compute a/b (occupied)",
                    _ratio(lw["tenant-a"]["compute_occupied"], lw["tenant-b"]["compute_occupied"]),
                    float("nan"))  # fmt: skip
            row("egress a/b (promise 2)",
                _ratio(lw["tenant-a"]["egress"], lw["tenant-b"]["egress"]) if lw else None,
                _ratio(sa["egress_share"], sb["egress_share"]))  # fmt: skip
        else:
            row("compute share b / pool (priced)",
                _ratio(lw["tenant-b"]["compute_priced"],
                       sum(lw[t]["compute_priced"] for t in TENANTS)) if lw else None,
                _ratio(sm["tenant-b"]["compute_share"][GROUP],
                       sum(sm[t]["compute_share"][GROUP] for t in TENANTS)))  # fmt: skip
        if lf:
            for t in TENANTS:
                print(
                    f"  live {t}: placed {lf['windows'][key]['tenants'][t]['placed']}, "
                    f"done {lf['windows'][key]['tenants'][t]['done']} in the window"
                )
        print(f"  sim pool utilisation {sim[key]['pool']['groups'][GROUP]['utilisation']:.3f}")
    print("\n== whole run, per tenant (live requests from the load's start; warm-up excluded)")
    sr = sim["a"]["tenants"]
    head = f"{'':22}" + "".join(f"{t + ' live':>16}{t + ' sim':>16}" for t in TENANTS)
    print(head)
    lines = {
        "arrived": (lambda t: lf["requests"][t]["arrived"], lambda t: sr[t]["requests"]["arrived"]),
        "offloaded (accepted)": (lambda t: lf["pool"][t]["accepted"],
                                 lambda t: sr[t]["requests"]["offloaded"]),
        "offloaded, done": (lambda t: lf["requests"][t]["offloaded_done"], lambda t: "-"),
        "local": (lambda t: lf["requests"][t]["local"], lambda t: sr[t]["requests"]["local"]),
        "completed": (lambda t: lf["requests"][t]["completed"],
                      lambda t: sr[t]["requests"]["completed"]),
    }  # fmt: skip
    for label, (lv, sv) in lines.items():
        cells = "".join(f"{(lv(t) if lf else '-')!s:>16}{sv(t)!s:>16}" for t in TENANTS)
        print(f"{label:22}{cells}")
    print("  sim refused: " + ", ".join(f"{t} {sr[t]['requests']['refused']}" for t in TENANTS))
    if lf:
        for t in TENANTS:
            r = lf["requests"][t]
            print(
                f"  live {t}: errors {r['errors'] or 'none'}; gateway offloads "
                f"{r['gateway_offloads']}, fallbacks {r['gateway_fallbacks'] or 'none'}"
            )
        for t in TENANTS:
            la, sa_ = lf["pool"][t]["accepted"], sr[t]["requests"]["offloaded"]
            print(f"  offloaded live/sim {t}: {_ratio(la, sa_):.3f}")
        print(
            "  live KV bytes per offload: "
            + ", ".join(f"{t} {v:.0f}" for t, v in lf["kv_bytes_mean"].items())
            + f" (profile's S_kv({s.prompt_tokens}) = {cost.kv_bytes(s.prompt_tokens)})"
        )
        print(f"  pool node process CPU / wall during the load: {live['node_cpu_share']}")
        print(
            "  cores busy during the load: "
            + ", ".join(f"core {c} {v:.0%}" for c, v in sorted(live["core_busy"].items()))
        )
        print(f"  load average before / after: {live['loadavg_before']} / {live['loadavg_after']}")
    print("\n== the profile's plumbing terms and the pool simulator")
    mentioned = pool_sim_mentions()
    unnamed = [t for t, (charged, _) in PLUMBING_IN_POOL_SIM.items()
               if charged and t not in mentioned]  # fmt: skip
    if unnamed:
        print(f"  NOTE: no pool simulator source names {unnamed}, which the table below says "
              "it charges: the table may be stale")  # fmt: skip
    else:
        print("  (checked now: every term charged below is named in "
              + ", ".join(POOL_SIM_SOURCES) + ")")  # fmt: skip
    from prfaas.perf.plumbing import PLUMBING_TERMS, RATIO_TERMS

    p = cost.plumbing
    untold = [t for t in PLUMBING_TERMS if t not in PLUMBING_IN_POOL_SIM]
    if untold:
        print(f"  NOTE: the table below says nothing of {untold}: it is stale")
    for term, (charged, where) in PLUMBING_IN_POOL_SIM.items():
        said = "charged" if charged else "NOT charged"
        unit = "" if term in RATIO_TERMS else " s"
        print(f"  {term:28} {getattr(p, term):.3g}{unit}  {said}: {where}")
    extra = p.prefill_per_request_s / cost.prefill_s(s.prompt_tokens)
    print(
        f"  (prefill_per_request_s is {extra:.1%} of one pool prefill's forward pass of "
        f"{s.prompt_tokens} tokens: charged to the pool node, simulated, and in the door's price)"
    )
    return {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()},
            "rate_rps": rate_rps, "sim": sim, "live": lf, "rows": rows}  # fmt: skip


# -- main ----------------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    d = Settings(workdir=Path("/tmp/pool-torch"))
    q = {**asdict(d), **QUICK}

    def dflt(name: str) -> str:
        return f"(default {getattr(d, name)}; --quick {q[name]})"

    p = argparse.ArgumentParser(
        prog="bench/pool_torch.py",
        description="Two tenants (weights 2:1, the same prompts and links) over-offering a pool "
        "of torch nodes, live and simulated from the same files: compute and egress shares, "
        "offload counts, side by side (issue 21 must-holds (a) and (c); no bound this round). "
        "Run it under `flock /tmp/prfaas-heavy.lock` on a shared machine. Every process it "
        "starts is stopped on exit, Ctrl-C and SIGTERM included.",
    )
    p.add_argument("--workdir", type=Path, default=d.workdir,
                   help="model, profile, files, live logs (default %(default)s); a profile "
                   "already there is reused")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="a short run: 55 s of load, a stops at 38 s, a coarse profile (about 2 "
                   "min with --profile, 3-4 min profiling)")  # fmt: skip
    p.add_argument("--profile", type=Path, help="use this profile file (no profiling); its "
                   "model name must be the model folder's name")  # fmt: skip
    p.add_argument("--model-path", type=Path,
                   help="the tiny model folder (default: made in the workdir)")  # fmt: skip
    p.add_argument(
        "--duration", type=float, help=f"seconds of load (tenant b's arrivals) {dflt('duration_s')}"
    )
    p.add_argument("--stop-a", type=float, help="tenant a's arrivals end here, must-hold (c); "
                   f"0: never {dflt('stop_a_s')}")  # fmt: skip
    p.add_argument("--warmup", type=float, help=f"the (a) window starts here {dflt('warmup_s')}")
    p.add_argument("--load", type=float, help="each tenant's rate / the pool's simulated "
                   f"capacity (nodes / prefill_node_s of one prompt) {dflt('load')}")  # fmt: skip
    p.add_argument(
        "--prompt-tokens", type=int, help=f"every prompt's length {dflt('prompt_tokens')}"
    )
    p.add_argument(
        "--pool-nodes",
        type=int,
        help=f"nodes of the torch group, all on --pool-core {dflt('pool_nodes')}",
    )
    p.add_argument(
        "--queue-prefills",
        type=int,
        help=f"each tenant's pool queue cap, in prompts {dflt('queue_prefills')}",
    )
    p.add_argument("--drain", type=float, help="seconds in-flight requests may take after the "
                   f"last arrival, then cancelled {dflt('drain_s')}")  # fmt: skip
    p.add_argument(
        "--pool-core", type=int, help=f"the pool node's core, and the profile's {dflt('pool_core')}"
    )
    p.add_argument("--pd-core", type=int, help=f"both tenants' PD sites' core {dflt('pd_core')}")
    p.add_argument(
        "--local-nice",
        type=int,
        help="nice of the tenants' local prefill nodes, "
        f"so fallback prefills do not starve the rest; 0: off {dflt('local_nice')}",
    )
    p.add_argument("--seed", type=int, help=f"tenant a's arrivals; b's is +1 {dflt('seed')}")
    p.add_argument("--sim-only", action="store_true", help="no live run (needs --profile)")
    p.add_argument("--json", type=Path, help="write the figures here")
    return p.parse_args(argv)


def settings(args: argparse.Namespace) -> Settings:
    fields: dict[str, Any] = dict(QUICK) if args.quick else {}
    given = {
        "duration_s": args.duration, "warmup_s": args.warmup, "load": args.load,
        "prompt_tokens": args.prompt_tokens, "pool_nodes": args.pool_nodes,
        "queue_prefills": args.queue_prefills, "drain_s": args.drain,
        "pool_core": args.pool_core, "pd_core": args.pd_core, "seed": args.seed,
        "local_nice": args.local_nice,
    }  # fmt: skip
    fields.update({k: v for k, v in given.items() if v is not None})
    if args.stop_a is not None:
        fields["stop_a_s"] = args.stop_a if args.stop_a > 0 else None
    s = Settings(workdir=Path(args.workdir).resolve(), **fields)
    if s.stop_a_s is not None and not s.warmup_s < s.stop_a_s < s.duration_s - s.settle_s:
        raise SystemExit("--stop-a must fall between --warmup and --duration (less the settle)")
    if s.threshold_tokens >= s.prompt_tokens:
        raise SystemExit("--prompt-tokens must exceed the threshold (every request offered)")
    return s


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    s = settings(args)
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    s.workdir.mkdir(parents=True, exist_ok=True)
    say(f"workdir {s.workdir}; load average {os.getloadavg()}")
    if args.profile is not None:
        prof = args.profile.resolve()
        name = profile_model_name(prof)
        model = (args.model_path or s.workdir / name).resolve()
        if args.model_path is None:
            model = make_model(s.workdir, name)
        if model.name != name:
            raise SystemExit(f"{prof} profiles {name!r}; the model folder is {model.name!r}")
    else:
        if args.sim_only:
            raise SystemExit("--sim-only needs --profile FILE")
        model = (args.model_path or make_model(s.workdir)).resolve()
        prof = s.workdir / f"profile-core{s.pool_core}.yaml"
        if not prof.is_file():
            profile(model, prof, s)
        else:
            say(f"reusing {prof} (delete it to profile again)")
    from prfaas.perf import cost_model_for_hardware

    cost = cost_model_for_hardware(model.name, str(prof))
    # Rounded as the tenant files say it: the live load draws the simulator's arrival times.
    rate = round(s.load * s.pool_nodes / node_s(cost, s.prompt_tokens), 6)
    files = write_files(s.workdir, model, prof, s, rate)
    say(f"files written: {files.pool}, " + ", ".join(str(p) for p in files.tenants.values()))
    sim = simulate(files, s)
    say("simulated")
    live = None if args.sim_only else run_live(files, model, s, rate)
    out = report(files, sim, live, cost, s, rate)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
        say(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
