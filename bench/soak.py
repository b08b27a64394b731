"""The long soak: a live deployment under ordinary use for a while, with faults, then a look at
what it holds. Prints requests sent / completed / hung up / failed (with the reasons clients saw),
the gateway's resident memory before and after, and the counters after (gateway in flight and
queued, every node's rotation, KV in use and work in flight).

    .venv/bin/python bench/soak.py [--deployment FILE] [--requests 2000] [--concurrency 64]
                                   [--kill d0] [--json]

Without ``--deployment`` it runs an emulated two-site deployment (examples/two-site.yaml's shape,
on free ports). ``--kill NODE`` SIGKILLs that node's process midway; the launcher's supervisor
restarts it. The short version of this run is tests/e2e/test_live_soak.py.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from prfaas.config import DeploymentConfig, load_deployment
from prfaas.serve.launcher import Launcher
from prfaas.serve.loadgen.soak import SoakConfig, run_soak
from prfaas.serve.supervisor import RestartPolicy

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "two-site.yaml"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def free_ports(d: DeploymentConfig) -> DeploymentConfig:
    gateway = d.gateway.model_copy(update={"port": 0, "control_port": 0})
    return d.model_copy(update={"gateway": gateway})


def settle(live: Launcher, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        health = httpx.get(f"{live.url}/health", timeout=5).json()
        nodes = live.nodes()
        idle = (
            health["in_flight"] == 0
            and health["queued"] == 0
            and all(
                n["in_rotation"] and n["kv_used_bytes"] == 0 and n["in_flight"] == 0 for n in nodes
            )
        )
        if idle or time.monotonic() > deadline:
            return {"health": health, "nodes": nodes, "settled": idle}
        time.sleep(0.25)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--deployment", type=Path, default=EXAMPLE)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--kill", default="d0", help="node whose process is SIGKILLed midway ('' none)")
    ap.add_argument(
        "--workdir", type=Path, help="keep the processes' logs here (default: a temp dir)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    deployment = free_ports(load_deployment(args.deployment))
    config = SoakConfig(
        model=deployment.engine.model,
        num_requests=args.requests,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        # The timed engine's tokens are random: only a real model has a greedy answer to compare.
        identical_every=0 if deployment.engine.kind == "timed" else SoakConfig.identical_every,
    )
    with tempfile.TemporaryDirectory(prefix="prfaas-soak-") as tmp:
        workdir = args.workdir or Path(tmp)
        live = Launcher(deployment, workdir, process_per_node=True, restart=RestartPolicy())
        live.start(ready_timeout_s=180)
        try:
            gateway_pid = live.child("gateway").proc.pid
            rss_before = rss_bytes(gateway_pid)

            def midway() -> None:
                if args.kill:
                    live.kill(args.kill)  # the supervisor restarts it; the soak goes on

            result = run_soak(live.url, config, midway=midway)
            after = settle(live)
            rss_after = rss_bytes(live.child("gateway").proc.pid)
        finally:
            live.stop()
    out = {
        **result.summary(),
        "killed": args.kill or None,
        "gateway_rss_mb_before": round(rss_before / 2**20, 1),
        "gateway_rss_mb_after": round(rss_after / 2**20, 1),
        "settled": after["settled"],
        "gateway_after": {k: after["health"].get(k) for k in ("in_flight", "queued")},
        "nodes_after": [
            {k: n.get(k) for k in ("node", "in_rotation", "why_not", "kv_used_bytes", "in_flight")}
            for n in after["nodes"]
        ],
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for key, value in out.items():
        print(f"{key:24s} {value}")


if __name__ == "__main__":
    main()
