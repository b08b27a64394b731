"""A pool node is held while it computes, not while its tenant's receiver verifies, live: the
front door's ``PlacementDriver`` with its real ``HttpNodeClient`` places prefills on one emulated
(``timed``) pool node (``PoolNodeHost`` behind the node API on a loopback socket), which streams
each KV over a real link to a tenant receiver that holds every session's END (its verification)
until the test lets it go. The node answers ``computed`` on ``/prefill/stream`` once it has
handed the last layer to the link, and the driver places the next prefill there while the
first one's verification is still held; the first one's outcome still settles it (``done`` once
verified), and one whose receiver gives up after ``computed`` fails to its tenant."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.pool.driver import PlacementDriver
from prfaas.pool.frontdoor import FrontDoor, Submit
from prfaas.pool.frontdoor import Receiver as Registered
from prfaas.pool.nodes_file import group_deployment
from prfaas.pool.payload import Payload
from prfaas.pool_file import load_pool
from prfaas.serve.gateway.node_client import HttpNodeClient
from prfaas.serve.listeners import bind, server_for
from prfaas.serve.node.app import create_node_app
from prfaas.serve.node.messages import NodeEndpoint, Registration, SamplingMsg, pack_tokens
from prfaas.serve.node.pool_host import PoolNodeHost
from prfaas.transfer import InboundSession, Receiver, TransferConfig
from prfaas.transfer import frames as F
from prfaas.transfer.channel import Channel

pytestmark = pytest.mark.timeout(60)
KEY = b"tenant-a-pool-key-0123456789abcdef"
TENANT = "tenant-a"
POOL = """
version: 1
units: {time_scale: 0.1, byte_divisor: 1000, block_tokens: 512}
egress_gbps: 100
groups:
  - {name: g-1t, model: paper-1t, kind: timed, hardware: h200, num_nodes: 1}
tenants:
  - {name: tenant-a, weight: 1, keys: [{id: a-1, env: PRFAAS_POOL_KEY_A}]}
"""
WAIT_S = 20.0
"""A bound on each wait for the system to get somewhere, not a timing assertion."""


class SlowVerifier(Receiver):
    """A tenant's receiver that verifies a session only when told: its END is held
    (``held``: session id -> END) until ``verify`` (a decode node slow to verify/install)."""

    def __init__(self, config: TransferConfig) -> None:
        super().__init__(config, lambda m: [bytearray(x.num_bytes) for x in m.layers])
        self.held: dict[int, tuple[Channel, F.End]] = {}
        self.sessions: dict[str, InboundSession] = {}
        self._consumer: asyncio.Task[None] | None = None

    def _on_end(self, ch: Channel, ev: F.End) -> None:
        self.held[ev.session_id] = (ch, ev)

    def verify(self, request_id: str) -> None:
        ch, ev = self.held.pop(self.sessions[request_id].session_id)
        super()._on_end(ch, ev)

    def ended(self, request_id: str) -> bool:
        s = self.sessions.get(request_id)
        return s is not None and s.session_id in self.held

    def consume(self) -> None:
        async def run() -> None:
            async for s in self:
                self.sessions[s.request_id] = s

        self._consumer = asyncio.ensure_future(run())

    async def aclose(self) -> None:
        if self._consumer is not None:
            self._consumer.cancel()
        await super().aclose()


async def _until(ok: Callable[[], bool], what: str, driver: PlacementDriver) -> None:
    async with asyncio.timeout(WAIT_S):
        while not ok():
            driver.tick()
            await asyncio.sleep(0.01)


async def _run(tmp: Path) -> None:
    (tmp / "pool.yaml").write_text(POOL)
    pool = load_pool(tmp / "pool.yaml")
    group = pool.groups[0]
    node = group.node_names[0]
    host = PoolNodeHost(group_deployment(pool, group, "p" * 32), [node], "http://127.0.0.1:9",
                        link_keys={"a-1": KEY}, pool_egress_gbps=pool.egress_gbps)  # fmt: skip
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = server_for(create_node_app(host))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    shape = PoolShape((GroupShape(group.name, group.model, 1),), 1e12, (TenantShare(TENANT),))
    door = FrontDoor(shape, epoch=1, lease_s=1e9, fingerprints={})
    driver = PlacementDriver(door, {node: group.name}, HttpNodeClient(host.auth),
                             clock=lambda: 0.0, wall=lambda: 0.0)  # fmt: skip
    rx = SlowVerifier(TransferConfig(psk=KEY, name=TENANT))
    try:
        async with asyncio.timeout(WAIT_S):
            while not server.started:
                await asyncio.sleep(0.01)
        ep = NodeEndpoint(node=node, site=group.name, role="prefill", host="127.0.0.1",
                          http_port=port)  # fmt: skip
        driver.register(Registration(process="p", nodes=[ep]))
        rx_port = (await rx.listen("127.0.0.1", 0))[1]
        rx.consume()
        door.register(TENANT, (Registered("d0", "127.0.0.1", rx_port),), 0.0)
        for i in range(3):
            tokens = [10 + i] * 2048
            req = Submit(TENANT, f"r{i}", group.model, (), 2048, "d0", f"s{i}", 1.0, 10_000)
            assert door.submit(TENANT, req, 0.0).status == 200
            driver.accept(Payload(TENANT, f"r{i}", "a-1", pack_tokens(tokens),
                                  SamplingMsg(max_new_tokens=1)))  # fmt: skip

        def state(rid: str) -> str:
            out = door.outcome(TENANT, rid)
            assert out is not None
            return out.state

        # r0 computed, its END held (not verified): the node takes r1 all the same.
        await _until(lambda: rx.ended("s0") and rx.ended("s1"), "r0 and r1 computed", driver)
        assert state("r0") == "running" and not rx.sessions["s0"].state.terminal
        await _until(lambda: rx.ended("s2"), "r2 computed, r0 and r1 still unverified", driver)
        assert driver.egress().backlog_of(TENANT) == 30_000  # all three KVs count until then
        rx.verify("s0")
        rx.sessions["s1"].abort("the decode node gave up")  # after its node computed it
        await _until(lambda: state("r0") == "done" and state("r1") == "failed", "ends", driver)
        out = door.outcome(TENANT, "r1")
        assert out is not None and out.reason.startswith("prefill:")  # the tenant falls back
        rx.verify("s2")
        await _until(lambda: state("r2") == "done", "r2 verified", driver)
        assert (driver.counters[TENANT]["done"], driver.counters[TENANT]["failed"]) == (2, 1)
        assert not driver.busy and driver.egress().backlog_of(TENANT) == 0
    finally:
        await rx.aclose()
        await driver.aclose()
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(serving, 10)
        await host.stop()


def test_a_pool_node_takes_its_next_prefill_while_the_tenant_verifies(tmp_path: Path) -> None:
    asyncio.run(_run(tmp_path))
