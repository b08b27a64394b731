"""The TTFT the pool's extra hop adds (issue 21 item 1), live on loopback (RTT 0), emulated nodes.

Two set-ups with the same hardware, link and requests, every request offloaded (threshold 0):
(1) today's single-gateway two-site deployment (PD site: 1 H20 prefill + 2 decode nodes; PrfaaS
site: 1 H200 node; 100 Gbps link), (2) a pool (one 1-node H200 group, 100 Gbps egress) and one
tenant gateway with the same PD site. Requests are sent one at a time (no queueing), streamed, and
TTFT is the first content chunk at the client. Prints wall-clock mean and median TTFT for each and
their difference (modelled seconds are wall / time_scale). The 40 ms RTT case needs the netns
testbed and is not run here.

    PRFAAS_POOL_KEY_A=... PYTHONPATH=src .venv/bin/python bench/pool_hop.py [--requests 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import openai
import yaml

from prfaas.config import load_deployment
from prfaas.pool.launcher import PoolLauncher
from prfaas.pool_file import load_pool
from prfaas.serve.launcher import Launcher

PD_SITE = """
  - name: pd
    kind: pd
    hardware: h20
    nodes: [{name: p0, role: prefill}, {name: d0, role: decode}, {name: d1, role: decode}]
"""
TWO_SITE = f"""
engine: {{kind: timed, model: paper-1t, time_scale: 0.1, byte_divisor: 1000}}
gateway: {{port: 0, control_port: 0}}
policy: {{router: threshold, threshold_tokens: 0}}
sites:{PD_SITE}
  - name: pf
    kind: prfaas
    hardware: h200
    nodes: [{{name: pf0, role: prefill}}]
links: [{{src: pf, dst: pd, gbps: 100, rtt_ms: 0}}]
"""
TENANT = f"""
engine: {{kind: timed, model: paper-1t, time_scale: 0.1, byte_divisor: 1000}}
gateway: {{port: 0, control_port: 0}}
policy: {{router: threshold, threshold_tokens: 0}}
sites:{PD_SITE}
pool:
  url: URL
  tenant: tenant-a
  key: {{id: a-1, env: PRFAAS_POOL_KEY_A}}
  link: {{gbps: 100, rtt_ms: 0}}
  tuner: fixed
"""
POOL = """
version: 1
units: {time_scale: 0.1, byte_divisor: 1000, block_tokens: 512}
front_door: {host: 127.0.0.1, port: 0, control_port: 0}
egress_gbps: 100
groups: [{name: g, model: paper-1t, kind: timed, hardware: h200, num_nodes: 1}]
tenants: [{name: tenant-a, keys: [{id: a-1, env: PRFAAS_POOL_KEY_A}]}]
"""


def _ttfts(url: str, n: int, num_tokens: int) -> list[float]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        stream = client.chat.completions.create(
            model="paper-1t",
            messages=[{"role": "user", "content": chr(97 + i % 26) * num_tokens}],
            max_tokens=2,
            stream=True,
        )
        first = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - t0
        out.append(first if first is not None else float("nan"))
    return out


def _offloaded(live: Launcher) -> int:
    return sum(1 for r in live.routes() if r.get("offloaded"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=8192)
    args = ap.parse_args()
    os.environ.setdefault("PRFAAS_POOL_KEY_A", "bench-pool-key-0123456789abcdef")
    tmp = Path(tempfile.mkdtemp(prefix="prfaas-pool-hop-"))
    results: dict[str, list[float]] = {}
    (tmp / "two.yaml").write_text(TWO_SITE)
    live = Launcher(load_deployment(tmp / "two.yaml"), tmp / "two-wd")
    try:
        live.start(ready_timeout_s=120)
        _ttfts(live.url, 2, args.tokens)  # warm-up
        results["two-site"] = _ttfts(live.url, args.requests, args.tokens)
        print(f"two-site: {_offloaded(live)} offloaded")
    finally:
        live.stop()
    (tmp / "pool.yaml").write_text(POOL)
    pool = PoolLauncher(load_pool(tmp / "pool.yaml"), tmp / "pool.yaml", tmp / "pool-wd")
    try:
        pool.start(120)
        (tmp / "tenant.yaml").write_text(TENANT.replace("URL", pool.url))
        tenant = Launcher(load_deployment(tmp / "tenant.yaml"), tmp / "tenant-wd")
        try:
            tenant.start(ready_timeout_s=120)
            deadline = time.monotonic() + 30
            while not any(n["node"] == "pool" and n.get("in_rotation") for n in tenant.nodes()):
                if time.monotonic() > deadline:
                    raise SystemExit("the pool never came into the tenant's rotation")
                time.sleep(0.2)
            _ttfts(tenant.url, 2, args.tokens)
            results["pool"] = _ttfts(tenant.url, args.requests, args.tokens)
            print(f"pool: {_offloaded(tenant)} offloaded")
        finally:
            tenant.stop()
    finally:
        pool.stop()
    rows = {
        name: {"mean_ms": 1000 * statistics.fmean(v), "median_ms": 1000 * statistics.median(v)}
        for name, v in results.items()
    }
    rows["extra_hop"] = {k: rows["pool"][k] - rows["two-site"][k] for k in rows["pool"]}
    print(yaml.safe_dump({"requests": args.requests, "prompt_tokens": args.tokens,
                          "rtt_ms": 0, "wall_ttft": rows}, sort_keys=False))  # fmt: skip


if __name__ == "__main__":
    main()
