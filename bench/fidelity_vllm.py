"""bench/fidelity.py's vLLM nodes (``--engine vllm``): what differs from its torch nodes.

- The model: the tiny llama vLLM's CPU backend loads (``make-tiny --arch llama --for-vllm``),
  8,192 positions (the lognormal shape's prompts reach 6,000 tokens).
- The profiles: per core, a plain vLLM OpenAI server of the same model (no PrfaasConnector, the
  deployment's other flags the same) pinned to that core as the deployment's server will be
  (its process tree's affinity and ``VLLM_CPU_OMP_THREADS_BIND``: ``testbed.vllm_servers``),
  measured by ``prfaas profile --endpoint`` (issue 20 item 4). Both cores at once, as the torch
  profiles are. TTFT and ITL are what a client sees of that server (its HTTP included). Then,
  the plain servers stopped, ``prfaas profile --plumbing-of`` the deployment adds the gateway's
  and the PD site's sidecar's terms to the PD profile and, with ``--remote-path``, what an
  offloaded request pays beyond them, per request and per KV byte (``measure_plumbing``).
- The deployment: ``engine.kind: vllm``, one server per site (the PD site's prefill and decode
  nodes share its server, as ``examples/vllm-tiny.yaml``), each site's server on its core
  (``cpu_bind``), the gateway pinned to the PrfaaS core as with torch nodes.
- What a run's CPU is read from: each launched process with every descendant (a site's sidecar
  and its vLLM server's API, engine core and worker processes).

Not importable as ``prfaas``: a bench script's helper, loaded by path from fidelity.py.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

MAX_MODEL_LEN = 8192
KV_CACHE_GIB = 1
"""Each server's KV cache (``VLLM_CPU_KVCACHE_SPACE``, the plain servers' too:
``testbed.vllm_servers.vllm_env``): 1 GiB holds 500K tokens of the tiny llama (2 KiB a token),
far above any run's."""
STARTUP_TIMEOUT_S = 300.0
PROCESSES = ("prfaas", "pd")
"""The launcher's node processes: one sidecar (and vLLM server) per site, named by the site."""
SIM_NODES = {"prfaas": ("prfaas/p0",), "pd": ("pd/p0", "pd/d0")}
"""A process's nodes in the simulator (the PD site's server runs both of its nodes)."""


def make_model(out: Path) -> Path:
    from prfaas.engine.torch.tiny import make_tiny, vllm_variant

    if (out / "config.json").is_file():
        return out
    overrides, dtype = vllm_variant("llama")
    overrides = {**overrides, "max_position_embeddings": MAX_MODEL_LEN}
    return make_tiny("llama", out, overrides=overrides, **({"dtype": dtype} if dtype else {}))


def plain_server(model: Path, served: str, core: int, logs: Path) -> Any:
    """A plain vLLM OpenAI server of ``model`` on ``core`` (its whole process tree pinned): the
    flags the deployment's sidecar gives its server (``serve/vllm/server.server_spec``) less the
    connector and the KV events."""
    from prfaas.testbed import vllm_servers

    return vllm_servers.start(
        f"plain-vllm-core{core}", model, core, logs, max_model_len=MAX_MODEL_LEN, served=served,
        extra_args=("--enable-prompt-tokens-details",), pin=True,
    )  # fmt: skip


def profile_command(url: str, served: str, model: Path, out: Path, core: int, s: Any) -> list[str]:
    """``prfaas profile --endpoint`` of the server on ``core``: the torch profiles' grid, the
    cached points shortened to fit the context (``--cached-tokens`` + the longest new prompt)."""
    longest = max(s.profile_new_tokens)
    cached = [c for c in s.profile_cached_tokens if c + longest < MAX_MODEL_LEN]
    memory = KV_CACHE_GIB * (1 << 30)
    return [
        sys.executable, "-m", "prfaas.cli", "profile", "--endpoint", url, "--model", served,
        "--model-spec", str(model), "-o", str(out), "--hardware", f"cpu-core{core}",
        "--memory-bytes", str(memory), "--repeats", str(s.profile_repeats),
        "--new-tokens", *map(str, s.profile_new_tokens),
        "--cached-tokens", *map(str, cached or [0]),
        "--batch-sizes", *map(str, s.profile_batches),
        "--contexts", *map(str, s.profile_contexts),
    ]  # fmt: skip


def profile_cores(
    model: Path, served: str, outs: dict[int, Path], s: Any, say: Any, wait: Any
) -> None:
    """Each core's plain server profiled, both at once (the profile clients unpinned; ``wait``:
    fidelity.py's ``wait_profiles``)."""
    todo = {core: out for core, out in outs.items() if not out.is_file()}
    if not todo:
        return
    from prfaas.testbed import vllm_servers

    say(f"starting plain vLLM servers on cores {sorted(todo)} for the profiles")
    starts = [functools.partial(plain_server, model, served, core, s.workdir) for core in todo]
    with vllm_servers.running(starts, STARTUP_TIMEOUT_S) as servers:
        urls = {core: server.url for core, server in zip(todo, servers, strict=True)}
        procs = {
            core: subprocess.Popen(profile_command(urls[core], served, model, out, core, s),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for core, out in todo.items()
        }  # fmt: skip
        failed = wait(procs)
    if failed:
        raise SystemExit("prfaas profile --endpoint failed on " + "\n".join(failed))


def measure_plumbing(deployment: Path, pd_profile: Path, say: Any) -> None:
    """``prfaas profile --plumbing-of`` the deployment, into its PD site's profile (the gateway's
    and the sidecar's terms and, ``--remote-path``, what an offloaded request pays beyond them;
    the plain servers are stopped by now). The PrfaaS site's profile keeps none (docs/vllm.md)."""
    say(f"measuring the deployment's plumbing terms into {pd_profile.name} (--plumbing-of "
        "--remote-path)")  # fmt: skip
    cmd = [sys.executable, "-m", "prfaas.cli", "profile", "--plumbing-of", str(deployment),
           "-o", str(pd_profile), "--remote-path"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"prfaas profile --plumbing-of failed:\n{done.stderr[-2000:]}")


def engine_section(model: Path, served: str, block_tokens: int) -> dict[str, Any]:
    """``block_tokens``: the server's own prefix-cache block (fidelity.VLLM_BLOCK_TOKENS)."""
    return {
        "kind": "vllm", "model": served, "model_path": str(model), "dtype": "float32",
        "block_tokens": block_tokens,
        "vllm": {"max_model_len": MAX_MODEL_LEN, "kv_cache_space_gib": KV_CACHE_GIB,
                 "startup_timeout_s": STARTUP_TIMEOUT_S},
    }  # fmt: skip


def site_engine(core: int) -> dict[str, Any]:
    return {"vllm": {"cpu_bind": str(core)}}


def simulation_section() -> dict[str, Any]:
    """The simulator as the file's engine kind runs it: vLLM's own prefill batching (the kind's
    default token budget) and prefix cache (its KV cache)."""
    return {"prefix_cache": True, "cache_bytes_per_node": KV_CACHE_GIB * (1 << 30),
            "tune": False, "drain_s": 3600}  # fmt: skip


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant (all their threads)."""
    from prfaas.commands.plumbing_classes import process_cpu_s, process_tree

    return process_cpu_s(process_tree(pid))
