"""The TTFT the pool's extra hop adds (issue 21 item 1), live, emulated (``timed``) nodes.

Two set-ups with the same hardware, link and requests, every request offloaded (threshold 0):
(1) today's single-gateway two-site deployment (PD site: 1 H20 prefill + 2 decode nodes; PrfaaS
site: 1 H200 node; 100 Gbps link), (2) a pool (one 1-node H200 group, 100 Gbps egress) and one
tenant gateway with the same PD site. Requests are sent one at a time (no queueing), streamed, and
TTFT is the first content chunk at the client. Prints wall-clock mean and median TTFT for each and
their difference.

``--rtt-ms 0`` (the default) runs everything on loopback. ``--rtt-ms R`` (root, ``ip``/``tc``)
puts the remote side in a network namespace behind a delay line of R ms round trip (wall: the
modelled RTT times ``--time-scale``; use ``--time-scale 1`` for a wall RTT of R ms): the two-site
deployment's PrfaaS site through ``netns: true``, and the whole pool (front door and nodes, one
``prfaas up pool.yaml`` in the namespace, its front door on the namespace's address), with the
tenant's gateway and PD nodes on this side's address (``gateway.host``: ``prfaas up`` then puts
its nodes there too, where the pool's nodes reach its receivers).

    PYTHONPATH=src .venv/bin/python bench/pool_hop.py [--requests 20] [--rtt-ms 40 --time-scale 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import yaml

from prfaas.config import load_deployment
from prfaas.serve.launcher import Launcher

PD_SITE = """
  - name: pd
    kind: pd
    hardware: h20
    nodes: [{name: p0, role: prefill}, {name: d0, role: decode}, {name: d1, role: decode}]
"""
TWO_SITE = """
engine: {kind: timed, model: paper-1t, time_scale: SCALE, byte_divisor: 1000}
gateway: {port: 0, control_port: 0}
policy: {router: threshold, threshold_tokens: 0}
netns: NETNS
sites:PD_SITE
  - name: pf
    kind: prfaas
    hardware: h200
    nodes: [{name: pf0, role: prefill}]
links: [{src: pf, dst: pd, gbps: 100, rtt_ms: RTT}]
"""
TENANT = """
engine: {kind: timed, model: paper-1t, time_scale: SCALE, byte_divisor: 1000}
gateway: {host: HOST, port: 0, control_port: 0}
policy: {router: threshold, threshold_tokens: 0}
sites:PD_SITE
pool:
  url: URL
  tenant: tenant-a
  key: {id: a-1, env: PRFAAS_POOL_KEY_A}
  link: {gbps: 100, rtt_ms: RTT}
  tuner: fixed
"""
POOL = """
version: 1
units: {time_scale: SCALE, byte_divisor: 1000, block_tokens: 512}
front_door: {host: HOST, port: 0, control_port: 0}
egress_gbps: 100
groups: [{name: g, model: paper-1t, kind: timed, hardware: h200, num_nodes: 1}]
tenants: [{name: tenant-a, keys: [{id: a-1, env: PRFAAS_POOL_KEY_A}]}]
"""


def _fill(text: str, **values: object) -> str:
    for name, value in values.items():
        text = text.replace(name, str(value))
    return text


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


def two_site(tmp: Path, args: argparse.Namespace) -> list[float]:
    netns = "true" if args.rtt_ms > 0 else "false"
    text = _fill(TWO_SITE, PD_SITE=PD_SITE, SCALE=args.time_scale, NETNS=netns, RTT=args.rtt_ms)
    (tmp / "two.yaml").write_text(text)
    live = Launcher(load_deployment(tmp / "two.yaml"), tmp / "two-wd")
    try:
        live.start(ready_timeout_s=120)
        _ttfts(live.url, 2, args.tokens)  # warm-up
        ttfts = _ttfts(live.url, args.requests, args.tokens)
        print(f"two-site: {_offloaded(live)} offloaded", flush=True)
        return ttfts
    finally:
        live.stop()


@contextmanager
def remote_side(rtt_ms: float, time_scale: float) -> Iterator[tuple[str, str, object]]:
    """(the pool's address, the tenant's address, the testbed or None): a namespace behind a
    delay line for an RTT above 0, else loopback for both."""
    if rtt_ms <= 0:
        yield "127.0.0.1", "127.0.0.1", None
        return
    from prfaas.netlab import TwoSiteTestbed, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"--rtt-ms {rtt_ms:g}: {reason}")
    # The deployment's own shaping of a link (serve.launch_netns.shaped_link): the same rate
    # and one-way delay the two-site run's `netns: true` gets.
    scale = 1000 * time_scale  # real bytes per payload byte (byte_divisor) x wall s per modelled s
    testbed = TwoSiteTestbed(
        rate_mbit=100 * 1000 / scale,
        one_way_delay_s=rtt_ms / 2000 * time_scale,
        tcp_mem_max_bytes=64 << 20,
        b_in_root=True,
    )
    try:
        testbed.setup()
        print(f"testbed: RTT {1000 * testbed.probe_rtt_s():.1f} ms wall", flush=True)
        yield testbed.ip_a, testbed.ip_b, testbed
    finally:
        testbed.teardown()


def pool_path(tmp: Path, args: argparse.Namespace) -> list[float]:
    with remote_side(args.rtt_ms, args.time_scale) as (pool_host, tenant_host, testbed):
        (tmp / "pool.yaml").write_text(_fill(POOL, SCALE=args.time_scale, HOST=pool_host))
        out = tmp / "pool-up.out"
        argv = [sys.executable, "-m", "prfaas.cli", "up", str(tmp / "pool.yaml"), "--workdir",
                str(tmp / "pool-wd")]  # fmt: skip
        if testbed is not None:
            argv = testbed.netns_argv("a", argv)  # type: ignore[attr-defined]
        with out.open("wb") as sink:
            pool = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while b"ready:" not in out.read_bytes():
                if pool.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the pool did not come up:\n" + out.read_text())
                time.sleep(0.2)
            door = yaml.safe_load((tmp / "pool-wd" / "pool.resolved.yaml").read_text())
            url = f"http://{door['front_door']['host']}:{door['front_door']['port']}"
            text = _fill(TENANT, PD_SITE=PD_SITE, SCALE=args.time_scale, HOST=tenant_host,
                         URL=url, RTT=args.rtt_ms)  # fmt: skip
            (tmp / "tenant.yaml").write_text(text)
            tenant = Launcher(load_deployment(tmp / "tenant.yaml"), tmp / "tenant-wd")
            try:
                tenant.start(ready_timeout_s=120)
                deadline = time.monotonic() + 30
                while not any(n["node"] == "pool" and n.get("in_rotation")
                              for n in tenant.nodes()):  # fmt: skip
                    if time.monotonic() > deadline:
                        raise SystemExit("the pool never came into the tenant's rotation")
                    time.sleep(0.2)
                _ttfts(tenant.url, 2, args.tokens)
                ttfts = _ttfts(tenant.url, args.requests, args.tokens)
                print(f"pool: {_offloaded(tenant)} offloaded", flush=True)
                return ttfts
            finally:
                tenant.stop()
        finally:
            # SIGTERM: `prfaas up` stops its children (their own sessions: a SIGKILL would leave
            # them running, inside a namespace about to go).
            pool.send_signal(signal.SIGTERM)
            try:
                pool.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(pool.pid, signal.SIGKILL)
                pool.wait(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--rtt-ms", type=float, default=0.0, help="modelled RTT (root for > 0)")
    ap.add_argument("--time-scale", type=float, default=0.1, help="the timed engine's")
    args = ap.parse_args()
    os.environ.setdefault("PRFAAS_POOL_KEY_A", "bench-pool-key-0123456789abcdef")
    tmp = Path(tempfile.mkdtemp(prefix="prfaas-pool-hop-"))
    results = {"two-site": two_site(tmp, args), "pool": pool_path(tmp, args)}
    rows = {
        name: {"mean_ms": 1000 * statistics.fmean(v), "median_ms": 1000 * statistics.median(v)}
        for name, v in results.items()
    }
    rows["extra_hop"] = {k: rows["pool"][k] - rows["two-site"][k] for k in rows["pool"]}
    print(yaml.safe_dump({"requests": args.requests, "prompt_tokens": args.tokens,
                          "rtt_ms": args.rtt_ms, "time_scale": args.time_scale,
                          "wall_ttft": rows}, sort_keys=False))  # fmt: skip


if __name__ == "__main__":
    main()
