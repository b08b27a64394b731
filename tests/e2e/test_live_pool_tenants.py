"""A live pool and two tenant gateways (each `prfaas up` of its own tenant file, emulated ``timed``
nodes): requests over the tenant's threshold are submitted to the pool over the signed API and
their KV goes from a pool node straight to the tenant's decode node; every request completes, each
tenant offloads, and its count of completed offloads equals the pool's counter for it; one
tenant's key cannot submit as the other; tenant b (``tuner: coordinated``) re-chooses its
threshold from the pool's feedback (its share, and the pool's shape its file does not say) and
routes with it; clients that hang up while their prefills wait at the
pool have them aborted there (counted at the pool and the tenant, no fallback). Then the front
door is SIGKILLed under load: every request still completes (prefilled locally), and the
fallbacks are counted by reason; then, the
door back, the pool's node group process is SIGKILLed under load: every request completes, the
ones its nodes held reported lost by the door (``failed:node_lost``) and prefilled locally."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from live_helpers import control
from pool_helpers import KEYS, LivePool, live_pool

from prfaas.config import load_deployment
from prfaas.pool.client import PoolClient, Refusal
from prfaas.serve.auth import SignedAuth
from prfaas.serve.keyring import ring_of_psks
from prfaas.serve.launcher import Launcher

pytestmark = pytest.mark.timeout(240)
THRESHOLD = 4096
NUM_REQUESTS = 24

TENANT_FILE = """
engine: {{kind: timed, model: paper-1t, time_scale: 0.1, byte_divisor: 1000}}
gateway: {{port: 0, control_port: 0}}
policy: {{router: threshold, threshold_tokens: {threshold}{policy_extra}}}
sites:
  - name: pd-{x}
    kind: pd
    hardware: h20
    nodes:
      - {{name: {x}-p0, role: prefill}}
      - {{name: {x}-d0, role: decode, pool_transfer_port: {pool_kv_port}}}
      - {{name: {x}-d1, role: decode}}
pool:
  url: {url}
  tenant: tenant-{x}
  key: {{id: {x}-1, env: PRFAAS_POOL_KEY_{X}}}
  link: {{gbps: 100, rtt_ms: 0}}
{tuner}
"""
FIXED = "  tuner: fixed"
COORDINATED = "  tuner: coordinated\n  ttft_target_s: 100"
"""Tenant b re-chooses its t from the pool's feedback (a high target: its router's gate, unit
tested, is not what this test is about); 8 lengths are enough for a re-choice."""


@contextmanager
def tenant(tmp: Path, x: str, pool: LivePool) -> Iterator[Launcher]:
    path = tmp / f"tenant-{x}.yaml"
    coordinated = x == "b"
    text = TENANT_FILE.format(
        x=x, X=x.upper(), url=pool.url, threshold=THRESHOLD, pool_kv_port=_free_port(),
        policy_extra=", tune_min_samples: 8" if coordinated else "",
        tuner=COORDINATED if coordinated else FIXED,
    )  # fmt: skip
    path.write_text(text)
    live = Launcher(load_deployment(path), tmp / f"tenant-{x}-wd")
    try:
        live.start(ready_timeout_s=90)
        yield live
    finally:
        live.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _pool_in_rotation(live: Launcher) -> bool:
    return any(n["node"] == "pool" and n.get("in_rotation") for n in live.nodes())


def _wait(what: str, cond: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


async def _load(url: str, n: int, took_s: list[float] | None = None, salt: str = "") -> list[str]:
    """``n`` chat completions, half over the threshold; every one must succeed. Each one's
    seconds (4 tokens: about its TTFT) go to ``took_s``, for the printed figures. Each prompt
    starts with its own number, so no two share a prefix (one prefilled at home would leave the
    rest of its length cached there, under the threshold: local), and a new ``salt`` shares none
    with earlier loads."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    sem = asyncio.Semaphore(8)

    async def one(i: int) -> str:
        length = 6000 + 97 * i if i % 2 == 0 else 1500 + 31 * i
        async with sem:
            start = time.monotonic()
            r = await client.chat.completions.create(
                model="paper-1t",
                messages=[{"role": "user", "content": f"{salt}{i} " + "x" * length}],
                max_tokens=4,
            )
            if took_s is not None:
                took_s.append(time.monotonic() - start)
        return r.choices[0].finish_reason or ""

    try:
        return list(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        await client.close()


def _metric(url: str, name: str) -> dict[str, float]:
    """A labelled counter from the gateway's ``/metrics``: label value -> value."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = rf'^{name}\{{\w+="([^"]+)"\}} (\S+)$'
    return {label: float(v) for label, v in re.findall(pattern, text, re.M)}


def _gauge(url: str, name: str) -> float:
    """An unlabelled gauge from the gateway's ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match is not None, name
    return float(match.group(1))


def _tuner(live: Launcher) -> dict[str, Any]:
    """The tenant's ``pool.tuner`` state (``/internal/control``)."""
    out: dict[str, Any] = control(live, "/internal/control")["pool_tuner"]
    return out


def _hang_up(url: str, n: int) -> None:
    """``n`` long prompts at once, each client gone 0.3 s after sending (its prefill still
    queued or running at the pool: 2 nodes, ~0.6 s per prompt here)."""

    def one(i: int) -> None:
        body = {"model": "paper-1t", "prompt": f"hang up {i} " + "x" * 60_000, "max_tokens": 4}
        with contextlib.suppress(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json=body, timeout=httpx.Timeout(10.0, read=0.3))

    with ThreadPoolExecutor(n) as workers:
        list(workers.map(one, range(n)))


async def _until_pool_holds(pool: LivePool, timeout_s: float = 30.0) -> None:
    """Until the pool's nodes hold some prefill (placed, not only queued at the door)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counters = await asyncio.to_thread(_pool_counters, pool)
        if any(int(c["running"]) > 0 for c in counters.values()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the pool's nodes held nothing within {timeout_s} s: {counters}")


def _pool_counters(pool: LivePool) -> dict[str, Any]:
    auth = SignedAuth(ring_of_psks(pool.internal_key))
    with httpx.Client(auth=auth, trust_env=False, timeout=10) as c:
        out: dict[str, Any] = c.get(f"{pool.control_url}/internal/tenants").json()["tenants"]
        return out


async def _cross_submit(pool: LivePool) -> Refusal | object:
    b = PoolClient(pool.url, "b-1", KEYS["PRFAAS_POOL_KEY_B"].encode())
    try:
        return await b.submit({
            "tenant": "tenant-a", "request_id": "steal", "model": "paper-1t",
            "num_uncached_tokens": 1, "receiver": "a-d0", "session": "s", "tokens": "BQAAAA==",
        })  # fmt: skip
    finally:
        await b.aclose()


def test_two_tenants_offload_to_a_live_pool(tmp_path: Path, monkeypatch: Any) -> None:
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    with live_pool(tmp_path) as pool, ExitStack() as stack:
        try:
            a = stack.enter_context(tenant(tmp_path, "a", pool))
            b = stack.enter_context(tenant(tmp_path, "b", pool))
            _wait("the pool in both tenants' rotation",
                  lambda: _pool_in_rotation(a) and _pool_in_rotation(b))  # fmt: skip

            calm: list[float] = []

            async def both() -> list[list[str]]:
                return list(await asyncio.gather(_load(a.url, NUM_REQUESTS, calm),
                                                 _load(b.url, NUM_REQUESTS, calm)))  # fmt: skip

            for finishes in asyncio.run(both()):
                assert len(finishes) == NUM_REQUESTS
            for live in (a, b):  # d0's pool receiver is on the port its file names
                fixed = live.deployment.node(live.deployment.sites[0].nodes[1].name)
                assert _listening(fixed.pool_transfer_port), fixed
            counters = _pool_counters(pool)
            for x, live in (("a", a), ("b", b)):
                offloads = _metric(live.url, "prfaas_pool_offloads_total")
                done = offloads.get("done", 0.0)
                why = _metric(live.url, "prfaas_pool_fallbacks_total")
                assert done > 0, (x, offloads, why)
                assert counters[f"tenant-{x}"]["done"] == done, (x, counters, offloads)
                routes = control(a if x == "a" else b, "/internal/routes")
                pooled = [r for r in routes if r.get("prefill_node") == "pool"]
                assert len(pooled) == done, (x, len(pooled), done)
            waited = time.monotonic()
            _wait("b's tuner re-choosing t", lambda: _tuner(b)["num_choices"] > 0, 15)
            tuned = _tuner(b)
            last = tuned["choices"][-1]
            print(f"b's tuner (waited {time.monotonic() - waited:.1f} s):", tuned)
            # Planned with the pool's shape and b's share, as its feedback said them (b's file
            # says neither); the gateway routes with the t chosen.
            assert (last["num_pool_nodes"], last["egress_bytes_per_s"]) == (2, 100e9 / 8), last
            assert 0 < last["share"] <= 1 and last["num_lengths"] >= 8, last
            assert tuned["threshold_tokens"] == last["threshold_tokens"], tuned
            _wait("b's t in its /metrics", lambda: _gauge(b.url, "prfaas_pool_threshold_tokens")
                  == control(b, "/internal/control")["threshold_tokens"], 5)  # fmt: skip
            assert control(a, "/internal/control")["pool_tuner"] is None  # a: tuner fixed
            stolen = asyncio.run(_cross_submit(pool))
            assert isinstance(stolen, Refusal) and stolen.reason == "wrong_tenant", stolen

            # Clients that hang up while their prefills wait at the pool: the tenant aborts
            # them there (the pool's count and the tenant's), none is a fallback.
            _hang_up(a.url, 8)
            _wait("the pool aborting a's hung-up prefills",
                  lambda: _pool_counters(pool)["tenant-a"]["aborted"] > 0)  # fmt: skip
            offloads = _metric(a.url, "prfaas_pool_offloads_total")
            print("hung up: the pool aborted", _pool_counters(pool)["tenant-a"]["aborted"],
                  "of a's prefills; a's offloads", offloads)  # fmt: skip
            assert offloads.get("aborted", 0.0) > 0, offloads
            assert _metric(a.url, "prfaas_pool_fallbacks_total") == {}

            # SIGKILL of the front door under load: every request completes (local fallback).
            async def killed() -> list[list[str]]:
                load = asyncio.gather(_load(a.url, NUM_REQUESTS, salt="door kill "),
                                      _load(b.url, NUM_REQUESTS, salt="door kill "))  # fmt: skip
                await asyncio.sleep(0.5)
                pool.kill_front_door(signal.SIGKILL)
                return list(await load)

            for finishes in asyncio.run(killed()):
                assert len(finishes) == NUM_REQUESTS  # every request completed (else: raised)
            # A tenant with nothing at the pool when it died has nothing to fall back: the
            # fallbacks are counted, by reason, over both.
            fallbacks = [_metric(live.url, "prfaas_pool_fallbacks_total") for live in (a, b)]
            print("fallbacks by reason (a, b):", fallbacks)
            assert sum(sum(f.values()) for f in fallbacks) > 0, fallbacks

            # SIGKILL of the pool's node group process (both its nodes) under load, once the
            # restarted front door is back in both tenants' rotation: every request completes,
            # those it held reported lost by the door and prefilled locally.
            _wait("the restarted front door in both tenants' rotation",
                  lambda: _pool_in_rotation(a) and _pool_in_rotation(b), 60)  # fmt: skip

            hit: list[float] = []

            async def node_killed() -> list[list[str]]:
                load = asyncio.gather(_load(a.url, NUM_REQUESTS, hit, "node kill "),
                                      _load(b.url, NUM_REQUESTS, hit, "node kill "))  # fmt: skip
                await _until_pool_holds(pool)
                pool.kill("g-1t", signal.SIGKILL)
                return list(await load)

            for finishes in asyncio.run(node_killed()):
                assert len(finishes) == NUM_REQUESTS
            after = [_metric(live.url, "prfaas_pool_fallbacks_total") for live in (a, b)]
            lost = sum(f.get("failed:node_lost", 0.0) for f in after)
            print("fallbacks by reason after the node group's kill (a, b):", after)
            print(f"request seconds, median/max: no fault {statistics.median(calm):.3f}/"
                  f"{max(calm):.3f}; node group killed {statistics.median(hit):.3f}/"
                  f"{max(hit):.3f}")  # fmt: skip
            assert lost > 0, after  # reported by the door, not left to the receiver's timeout
        except BaseException:
            print(pool.log_tail())
            raise
