"""A pool node's prefix namespaces, live: the node process's own ``PoolNodeHost`` (as
``pool/node_main.py`` builds it from the pool file, an emulated ``timed`` group) prefills for two
tenants and streams each one's KV over a real loopback link, under that tenant's key, to that
tenant's receiver. Tenant a's next turn of a long prompt is found in the node's store (fewer tokens
computed); tenant b's identical prompt finds nothing of a's; b flooding the store with prompts of
its own fills it, evicts only b's own entries, and a's prompt still hits, as the front door
foresees from the node's journal and the salted chain it computes itself (``pool.prefix_hits``).
The store is shrunk to six of these prompts' checkpoints so that a few prefills fill it (its
quotas follow, 2:1 by weight)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prfaas.pool.node_main import prefix_namespaces
from prfaas.pool.nodes_file import group_deployment
from prfaas.pool.prefix_hits import PrefixHits
from prfaas.pool_file import load_pool
from prfaas.serve.node.messages import PrefillCommand, SamplingMsg, pack_tokens
from prfaas.serve.node.pool_host import PoolNodeHost
from prfaas.transfer import Manifest, Receiver, TransferConfig

pytestmark = pytest.mark.timeout(120)
KEYS = {"a-1": b"tenant-a-pool-key-0123456789abcdef", "b-1": b"tenant-b-pool-key-0123456789abcdef"}
POOL = """
version: 1
units: {time_scale: 0.1, byte_divisor: 1000, block_tokens: 512}
egress_gbps: 100
groups:
  - {name: g-1t, model: paper-1t, kind: timed, hardware: h200, num_nodes: 1}
tenants:
  - {name: tenant-a, weight: 2, keys: [{id: a-1, env: PRFAAS_POOL_KEY_A}]}
  - {name: tenant-b, weight: 1, keys: [{id: b-1, env: PRFAAS_POOL_KEY_B}]}
"""
LONG = [7] * 2048
"""Four blocks: the checkpoint a prefill of it (or of a longer prompt starting so) stores last."""


def _allocate(manifest: Manifest) -> list[bytearray]:
    return [bytearray(layer.num_bytes) for layer in manifest.layers]


async def _consume(rx: Receiver) -> None:
    async for session in rx:
        await session.complete(timeout_s=30.0)


def _cmd(tenant: str, rid: str, tokens: list[int], port: int) -> PrefillCommand:
    """What the placement driver sends (``pool/driver.py``): no hashes, look up and store."""
    return PrefillCommand(
        request_id=rid, tokens=pack_tokens(tokens), use_cached_tokens=len(tokens),
        store_prefix=True, decode_node="d0", decode_host="127.0.0.1", decode_transfer_port=port,
        cross_site=True, sampling=SamplingMsg(max_new_tokens=1), key_id=f"{tenant[-1]}-1",
        tenant=tenant,
    )  # fmt: skip


async def _run(tmp: Path) -> None:
    (tmp / "pool.yaml").write_text(POOL)
    pool = load_pool(tmp / "pool.yaml")
    group = pool.groups[0]
    internal = "p" * 32
    host = PoolNodeHost(
        group_deployment(pool, group, internal), list(group.node_names), "http://127.0.0.1:9",
        link_keys=KEYS, pool_egress_gbps=pool.egress_gbps,
        prefix_namespaces=prefix_namespaces(pool, internal),
    )  # fmt: skip
    node = group.node_names[0]
    store = host.prefix_store
    rx = {t: Receiver(TransferConfig(psk=KEYS[f"{t[-1]}-1"], name=t), _allocate) for t in "ab"}
    async with rx["a"], rx["b"]:
        ports = {t: (await r.listen("127.0.0.1", 0))[1] for t, r in rx.items()}
        consumers = [asyncio.create_task(_consume(r)) for r in rx.values()]

        async def prefill(tenant: str, rid: str, tokens: list[int]) -> int:
            """The tokens the node found in its store for this prefill."""
            out = await host.prefill(node, _cmd(tenant, rid, tokens, ports[tenant[-1]]))
            assert out.ok, out.error
            return out.num_cached_tokens

        try:
            assert await prefill("tenant-a", "a0", LONG) == 0
            entry_bytes = store.used_bytes
            assert entry_bytes > 0 and len(store) == 1
            store.capacity_bytes = 6 * entry_bytes + entry_bytes // 2
            host.set_prefix_namespaces(host.prefix_namespaces)  # type: ignore[arg-type]
            quota_a = store.quota_bytes("tenant-a")
            assert quota_a == store.capacity_bytes * 2 // 3
            # a's next turn: the prompt it sent, then 515 tokens more (one more block stored).
            turn = [*LONG, *[8] * 515]
            computed = host.nodes[node].meter.prefilled_tokens
            assert await prefill("tenant-a", "a1", turn) == len(LONG)  # a hit
            assert host.nodes[node].meter.prefilled_tokens - computed == 515  # the rest only
            held_a = {u.namespace: u for u in store.usage()}["tenant-a"]
            assert held_a.num_entries == 2
            # b's identical prompt finds nothing of a's (another chain, another namespace).
            assert await prefill("tenant-b", "b0", turn) == 0
            for i in range(10):  # b floods the store with prompts of its own
                assert await prefill("tenant-b", f"b{i + 1}", [100 + i] * 2048) == 0
            usage = {u.namespace: u for u in store.usage()}
            assert usage["tenant-a"] == held_a  # a's entries all there, untouched by b
            assert usage["tenant-b"].used_bytes > store.quota_bytes("tenant-b")  # the room a left
            assert store.capacity_bytes - entry_bytes < store.used_bytes <= store.capacity_bytes
            # The front door's view: the node's journal (its heartbeat) mirrored, each prompt's
            # chain computed from the internal key as the node computes it, estimates what the
            # node's own lookup finds, for each tenant.
            hits = PrefixHits(prefix_namespaces(pool, internal), store.block_tokens)
            hits.registered("p", group.name)
            for _ in range(10):
                report = host.heartbeat().prefix
                assert report is not None  # a namespaced pool node still sends its journal
                ack = hits.report("p", report)
                assert ack is not None and not ack.snapshot
                store.acknowledge(ack)
                if not report.changes:
                    break
            prompt = [*LONG, 9]
            for tenant in ("tenant-a", "tenant-b"):
                chain = hits.chain(tenant, "x", pack_tokens(prompt))
                truth = store.cached_tokens(chain, len(prompt), tenant)
                assert hits.hit_tokens("p", chain, len(prompt), 0.0) == truth
            a_chain = hits.chain("tenant-a", "x", pack_tokens(prompt))
            assert hits.hit_tokens("p", a_chain, len(prompt), 0.0) == len(LONG)
            assert await prefill("tenant-a", "a2", prompt) == len(LONG)
            # The heartbeat to the front door says so per tenant (modelled bytes: x1000).
            spaces = {n.namespace: n for n in host.heartbeat().namespaces}
            assert spaces["tenant-a"].hit_tokens == 2 * len(LONG)
            assert spaces["tenant-b"].hit_tokens == 0
            assert spaces["tenant-a"].quota_bytes == quota_a * 1000
        finally:
            for consumer in consumers:
                consumer.cancel()
            await host.stop()


def test_a_tenants_prefixes_hit_for_it_alone_and_survive_anothers_flood(tmp_path: Path) -> None:
    asyncio.run(_run(tmp_path))
