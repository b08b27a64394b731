"""A live deployment of emulated (``timed``) nodes, gateway and workers in this process on real
sockets: after requests with prefix reuse, and after the stores evict, the gateway's mirror of
each process's prefix store (what routing reads) holds exactly what the store holds and answers
every prompt as the store's own lookup would; a prompt that shares blocks with an earlier one is
prefilled from them and the decode node pins what the mirror said."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from control_helpers import deployment_dict

from prfaas.config import DeploymentConfig
from prfaas.serve.gateway.app import create_cluster_gateway
from prfaas.serve.gateway.hashing import block_hashes
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.listeners import PortRouter, bind, server_for
from prfaas.serve.node.app import create_node_app
from prfaas.serve.node.host import WorkerHost
from prfaas.serve.run import gateway_tokenizer_and_model

pytestmark = pytest.mark.timeout(90)
BLOCK = 512
SYNC_TIMEOUT_S = 20.0


@dataclass
class _Live:
    d: DeploymentConfig
    registry: NodeRegistry
    workers: list[WorkerHost]
    url: str
    dispatcher: Any


@asynccontextmanager
async def _deployment() -> AsyncIterator[_Live]:
    raw = deployment_dict()
    raw["heartbeat_interval_s"] = 0.05
    raw["engine"]["block_tokens"] = BLOCK
    d = DeploymentConfig.model_validate(raw)
    tokenizer, model = gateway_tokenizer_and_model(d)
    apps = create_cluster_gateway(d, tokenizer, model)
    client_sock, control_sock = (
        bind("127.0.0.1", d.gateway.port),
        bind("127.0.0.1", d.gateway.control_port),
    )
    servers = [server_for(PortRouter(apps.client, {d.gateway.control_port: apps.control}))]
    tasks = [asyncio.create_task(servers[0].serve(sockets=[client_sock, control_sock]))]
    workers: list[WorkerHost] = []
    try:
        for site in d.sites:
            worker = WorkerHost(d, [n.name for n in site.nodes], d.control_url)
            workers.append(worker)
            sock = bind("127.0.0.1", 0)
            await worker.start(sock.getsockname()[1])
            servers.append(server_for(create_node_app(worker)))
            tasks.append(asyncio.create_task(servers[-1].serve(sockets=[sock])))
        registry: NodeRegistry = apps.client.state.registry
        names = [n.name for s in d.sites for n in s.nodes]

        def registered() -> bool:
            return all(n in registry.endpoints and registry.rotation(n)[0] for n in names)

        await _until(registered, "every node in rotation")
        url = f"http://127.0.0.1:{d.gateway.port}"
        yield _Live(d, registry, workers, url, apps.client.state.dispatcher)
    finally:
        for server in servers:
            server.should_exit = True
        for task in tasks:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 10)
        for worker in workers:
            await worker.stop()


async def _until(ok: Any, what: str) -> None:
    async with asyncio.timeout(SYNC_TIMEOUT_S):  # a bound on a wait, not a timing assertion
        while not ok():
            await asyncio.sleep(0.02)


async def _synced(live: _Live) -> None:
    """Until every store's changes are applied and acknowledged (the heartbeats caught up)."""

    def caught_up() -> bool:
        for w in live.workers:
            mirror = live.registry.kv.store(w.process_name)
            if len(w.prefix_store.journal) or mirror is None:
                return False
            if mirror.epoch != w.prefix_store.epoch or mirror.applied_seq != w.prefix_store.seq:
                return False
        return True

    await _until(caught_up, "the mirrors caught up with the stores")


def _assert_mirrors_hold_the_stores(live: _Live, prompts: list[list[int]]) -> None:
    now = asyncio.get_running_loop().time()  # the gateway's clock: time.monotonic()
    for w in live.workers:
        mirror = live.registry.kv.store(w.process_name)
        assert mirror is not None
        assert mirror.entries == dict(w.prefix_store.entries()), w.process_name
        for tokens in prompts:
            hashes = block_hashes(tokens, BLOCK)
            held = w.prefix_store.cached_tokens(hashes, len(tokens))
            assert live.registry.kv.cached_tokens(w.process_name, hashes, len(tokens), now) == held
            site = w.site.name
            peek = live.registry.kv.peek(hashes, len(tokens), now)
            assert peek.get(site, 0) == held  # one process per site: its store is the site's


async def _complete(client: httpx.AsyncClient, live: _Live, prompt: list[int]) -> dict[str, Any]:
    body = {"model": "paper-1t", "prompt": prompt, "max_tokens": 2}
    r = await client.post(f"{live.url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    record = live.dispatcher.records[-1]
    return {k: getattr(record, k) for k in record.__slots__}


def _prompt(seed: int, num_tokens: int) -> list[int]:
    return [(seed * 131 + 7 * i) % 250 + 1 for i in range(num_tokens)]


async def test_the_gateways_mirror_holds_what_each_store_holds() -> None:
    async with _deployment() as live, httpx.AsyncClient(timeout=60, trust_env=False) as client:
        pd = next(w for w in live.workers if w.site.name == "pd")
        base = _prompt(1, 3 * BLOCK + 100)
        first = await _complete(client, live, base)
        assert first["prefill_site"] == "pd" and first["num_cached_tokens"] == 0
        # The next turn shares the 3 blocks: it is prefilled from them, whether the mirror has
        # the store's report yet or only the first prefill's outcome.
        turn = base[: 3 * BLOCK] + _prompt(2, 2 * BLOCK)
        second = await _complete(client, live, turn)
        assert second["num_cached_tokens"] == 3 * BLOCK
        # Offloaded (> the 8192-token threshold): the PrfaaS site's store gets an entry too.
        long_prompt = _prompt(3, 9000)
        assert (await _complete(client, live, long_prompt))["offloaded"]
        await _synced(live)
        prompts = [base, turn, long_prompt]
        _assert_mirrors_hold_the_stores(live, prompts)
        assert live.registry.kv.peek(block_hashes(turn, BLOCK), len(turn), 0.0)

        # Room for about two entries from now on: every new prompt evicts older ones.
        entry_bytes = pd.prefix_store.used_bytes // max(len(pd.prefix_store), 1)
        pd.prefix_store.capacity_bytes = int(entry_bytes * 2.5)
        evicting = [_prompt(10 + i, 2 * BLOCK + 50) for i in range(4)]
        for prompt in evicting:
            await _complete(client, live, prompt)
        await _synced(live)
        prompts += evicting
        held = {
            i for i, p in enumerate(prompts) if pd.prefix_store.cached_tokens(
                block_hashes(p, BLOCK), len(p)
            )
        }  # fmt: skip
        assert 0 not in held and 1 not in held  # the first prompts' prefixes were evicted
        _assert_mirrors_hold_the_stores(live, prompts)
        # A decode node pinned what the mirror said every time (no stale figure was patched).
        mismatches = live.dispatcher.metrics.registry.get_sample_value(
            "prfaas_prefix_mirror_mismatch_total", {"side": "decode"}
        )
        assert not mismatches
