"""A live pool (``prfaas up pool.yaml``, emulated ``timed`` nodes) used by two tenants over the
signed API v1: their prefills are placed on pool nodes, whose KV streams to each tenant's own
receiver (authenticated with the tenant's key) and is verified there; the pool's per-tenant
counters agree; one tenant's key cannot submit as the other or to the other's receiver; each
tenant told its own link rate with its receivers, and the pool node paced each on a route of its
own at that rate: each tenant's feedback reads its own link, not the other's. The pool node keeps
each tenant's prefixes in a namespace of its own: a's prompts (one token repeated, of growing
lengths) find each other's prefixes there; b's, the same tokens, find none of a's, and each
tenant's feedback shows its own namespace, its quota 2:1 as the weights."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from pool_helpers import KEYS, LivePool, live_pool, submit_body

from prfaas.pool.client import Accepted, Feedback, PoolClient, Refusal
from prfaas.pool.tenant_prefixes import GroupPrefixes
from prfaas.serve.auth import SignedAuth, signed_headers
from prfaas.serve.keyring import ring_of_psks
from prfaas.transfer import Manifest, Receiver, TransferConfig

pytestmark = pytest.mark.timeout(120)
KEY_A = KEYS["PRFAAS_POOL_KEY_A"].encode()
KEY_B = KEYS["PRFAAS_POOL_KEY_B"].encode()
NUM_REQUESTS = 12
NUM_B = 3
LINK_GBPS = {"tenant-a": 50.0, "tenant-b": 20.0}
"""Each tenant's own link (modelled Gbps; the pool's egress is 100): two routes, two rates."""


def _allocate(manifest: Manifest) -> list[bytearray]:
    return [bytearray(layer.num_bytes) for layer in manifest.layers]


async def _consume(rx: Receiver, got: list[str]) -> None:
    async for session in rx:
        await session.complete(timeout_s=30.0)
        got.append(session.manifest.request_id)


async def _own_links(clients: dict[str, PoolClient]) -> dict[str, Feedback]:
    """Each tenant's feedback once the pool node's heartbeat (every 0.5 s) carried a reading of
    its route."""
    for _ in range(100):
        fbs = {t: await c.feedback() for t, c in clients.items()}
        fb = {t: f for t, f in fbs.items() if isinstance(f, Feedback)}
        if len(fb) == len(clients) and all(
            f.link is not None and f.link.reading is not None for f in fb.values()
        ):
            return fb
        await asyncio.sleep(0.1)
    raise AssertionError(f"no link reading in the feedback: {fbs}")


async def _own_prefixes(
    clients: dict[str, PoolClient], looked: dict[str, int]
) -> dict[str, GroupPrefixes]:
    """Each tenant's feedback's one ``prefixes`` row once the pool node's heartbeat counted all
    its lookups (``looked``: prompt tokens)."""
    for _ in range(100):
        fbs = {t: await c.feedback() for t, c in clients.items()}
        rows = {t: f.prefixes[0] for t, f in fbs.items()
                if isinstance(f, Feedback) and f.prefixes}  # fmt: skip
        if len(rows) == len(clients) and all(r.lookup_tokens == looked[t] for t, r in rows.items()):
            return rows
        await asyncio.sleep(0.1)
    raise AssertionError(f"the feedback never counted every lookup: {fbs}")


async def _tenant_run(pool: LivePool) -> None:
    got: list[str] = []
    got_b: list[str] = []
    rx_b = Receiver(TransferConfig(psk=KEY_B, name="b-d0"), _allocate)
    async with Receiver(TransferConfig(psk=KEY_A, name="a-d0"), _allocate) as rx, rx_b:
        _, port = await rx.listen("127.0.0.1", 0)
        _, port_b = await rx_b.listen("127.0.0.1", 0)
        consumers = [asyncio.create_task(_consume(rx, got)),
                     asyncio.create_task(_consume(rx_b, got_b))]  # fmt: skip
        a = PoolClient(pool.url, "a-1", KEY_A)
        b = PoolClient(pool.url, "b-1", KEY_B)
        try:
            reg = await a.register([{"name": "a-d0", "host": "127.0.0.1", "transfer_port": port}],
                                   (LINK_GBPS["tenant-a"], 10.0))  # fmt: skip
            assert not isinstance(reg, Refusal), reg
            reg = await b.register(
                [{"name": "b-d0", "host": "127.0.0.1", "transfer_port": port_b}],
                (LINK_GBPS["tenant-b"], 0.0),
            )
            assert not isinstance(reg, Refusal), reg
            # Isolation: b's key cannot submit as a, nor to a's receiver as itself.
            as_a = await b.submit(submit_body("tenant-a", "x1", "a-d0", 1000))
            assert isinstance(as_a, Refusal) and as_a.reason == "wrong_tenant", as_a
            to_a = await b.submit(submit_body("tenant-b", "x2", "a-d0", 1000))
            assert isinstance(to_a, Refusal) and to_a.reason == "receiver_not_registered"
            answers = await asyncio.gather(
                *(a.submit(submit_body("tenant-a", f"r{i}", "a-d0", 2048 + 512 * i, token=5))
                  for i in range(NUM_REQUESTS)),
                *(b.submit(submit_body("tenant-b", f"q{i}", "b-d0", 4096, token=5))
                  for i in range(NUM_B)),
            )  # fmt: skip
            assert all(isinstance(x, Accepted) for x in answers), answers
            states: dict[str, str] = {}
            cached: dict[str, int] = {}
            mine = [(a, f"r{i}") for i in range(NUM_REQUESTS)]
            mine += [(b, f"q{i}") for i in range(NUM_B)]
            for _ in range(600):
                await a.heartbeat()
                await b.heartbeat()
                for client, rid in mine:
                    out = await client.outcome(rid)
                    assert not isinstance(out, Refusal), out
                    states[rid] = out["state"]
                    cached[rid] = out["cached_tokens"]
                if all(s in ("done", "failed", "aborted") for s in states.values()):
                    break
                await asyncio.sleep(0.1)
            assert set(states.values()) == {"done"}, states
            assert sorted(got) == sorted(f"s-r{i}" for i in range(NUM_REQUESTS))
            assert sorted(got_b) == sorted(f"s-q{i}" for i in range(NUM_B))
            # Each tenant's KV went on its own route, paced at the rate it told (the node's
            # reading of that route, in its feedback): its own link, never the other's.
            fb = await _own_links({"tenant-a": a, "tenant-b": b})
            for tenant, f in fb.items():
                assert f.tenant == tenant and f.link is not None and f.link.reading is not None
                assert f.link.gbps == LINK_GBPS[tenant], (tenant, f)
                assert f.link.reading.pace_gbps == pytest.approx(LINK_GBPS[tenant]), (tenant, f)
                assert f.link.reading.num_senders == 1 and f.link.reading.basis, (tenant, f)
            # Prefixes: a's prompts found earlier ones of a's at the pool node; b's, 4,096 of the
            # same token (a's hold their first blocks), found nothing: a's namespace is not b's
            # (b's own are all 8 blocks: a lookup stops at 7). Each reads its own namespace, and
            # the quotas are the weights' 2:1.
            looked = {"tenant-a": sum(2048 + 512 * i for i in range(NUM_REQUESTS)),
                      "tenant-b": 4096 * NUM_B}  # fmt: skip
            rows = await _own_prefixes({"tenant-a": a, "tenant-b": b}, looked)
            assert rows["tenant-a"].hit_tokens == sum(cached[f"r{i}"] for i in range(NUM_REQUESTS))
            assert rows["tenant-a"].hit_tokens > 0 and rows["tenant-a"].num_entries > 0, rows
            assert rows["tenant-b"].hit_tokens == 0 == sum(cached[f"q{i}"] for i in range(NUM_B))
            assert rows["tenant-a"].quota_bytes == pytest.approx(2 * rows["tenant-b"].quota_bytes)
            # The pool's own counters (its listener, signed with the pool's key, not a tenant's).
            auth = SignedAuth(ring_of_psks(pool.internal_key))
            async with httpx.AsyncClient(auth=auth, trust_env=False) as op:
                counters = (await op.get(f"{pool.control_url}/internal/tenants")).json()
            host = pool.control_url.removeprefix("http://")
            signed = signed_headers(KEY_A, "GET", host, "/internal/tenants", b"", time.time(),
                                    key_id="a-1")  # fmt: skip
            as_tenant = httpx.get(f"{pool.control_url}/internal/tenants", headers=signed)
            assert as_tenant.status_code == 401  # a tenant's key does not open the pool's listener
            row = counters["tenants"]["tenant-a"]
            assert row["accepted"] == row["placed"] == row["done"] == NUM_REQUESTS, counters
            assert counters["tenants"]["tenant-b"]["done"] == NUM_B
            # The operator sees both links, each tenant's own.
            assert {t: counters["tenants"][t]["link"]["gbps"] for t in LINK_GBPS} == LINK_GBPS
            # The same per tenant for Prometheus, unsigned on the pool's listener only.
            scraped = httpx.get(f"{pool.control_url}/metrics").text
            done = 'prfaas_pool_tenant_prefills_total{outcome="done",tenant="tenant-a"}'
            assert f"{done} {float(NUM_REQUESTS)}" in scraped, scraped
            assert httpx.get(f"{pool.url}/metrics").status_code in (401, 404)
        finally:
            for consumer in consumers:
                consumer.cancel()
            await a.aclose()
            await b.aclose()


def test_pool_places_a_tenants_prefills_on_its_nodes(tmp_path: Path) -> None:
    with live_pool(tmp_path) as pool:
        try:
            asyncio.run(_tenant_run(pool))
            status = subprocess.run(
                [sys.executable, "-m", "prfaas.cli", "status", "--json",
                 str(pool.workdir / "pool.resolved.yaml")],
                capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            report = json.loads(status.stdout)
            assert report["tenants"]["tenant-a"]["done"] == NUM_REQUESTS
            assert report["tenants"]["tenant-b"]["done"] == NUM_B
            assert len(report["nodes"]) == 2 and all(n["live"] for n in report["nodes"])
            assert {p["name"] for p in report["processes"]["processes"]} == {"frontdoor", "g-1t"}
        except BaseException:
            print(pool.log_tail())
            raise
