"""``WorkerHost.link_to`` against a KV port that accepts TCP but never answers the handshake (a
listening socket nobody accepts on): the links to other peers are made meanwhile, every prefill
waiting for the dead peer shares one bounded connect and gets a ``ConnectError`` naming the peer,
a cancelled waiter leaves the connect to the others, and a later call tries again."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from control_helpers import PSK, deployment_dict

import prfaas.transfer.link_pool as links_module
from prfaas.config import DeploymentConfig
from prfaas.serve.node.host import WorkerHost
from prfaas.transfer import ConnectError, Receiver, Refused, TransferConfig
from prfaas.transfer import Link as TransferLink

pytestmark = pytest.mark.timeout(60)

CONNECT_TIMEOUT_S = 1.0


def _refuse(_manifest: Any) -> Any:
    raise Refused("this test receives no sessions")


@pytest.fixture
def blackhole() -> Any:
    """A port that completes TCP connects (the kernel's backlog) but never reads a byte."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield sock.getsockname()[1]
    sock.close()


async def test_a_dead_kv_port_does_not_stall_links_to_other_peers(
    monkeypatch: pytest.MonkeyPatch, blackhole: int
) -> None:
    monkeypatch.setattr(links_module, "CONNECT_TIMEOUT_S", CONNECT_TIMEOUT_S)
    calls: list[int] = []
    connect = TransferLink.connect

    async def counting(host: str, port: int, config: TransferConfig) -> TransferLink:
        calls.append(port)
        return await connect(host, port, config)

    monkeypatch.setattr(TransferLink, "connect", counting)
    deployment = DeploymentConfig.model_validate(deployment_dict())
    worker = WorkerHost(deployment, ["pf0"], "http://127.0.0.1:9")
    async with Receiver(TransferConfig(psk=PSK.encode(), name="good"), _refuse) as good_peer:
        _, good_port = await good_peer.listen("127.0.0.1", 0)
        try:
            stuck = [
                asyncio.create_task(worker.link_to("127.0.0.1", blackhole, True)) for _ in range(3)
            ]
            await asyncio.sleep(0)  # the dead peer's connect is under way
            link = await worker.link_to("127.0.0.1", good_port, True)
            # The good link was made while the dead peer's connect was still waiting.
            assert not any(t.done() for t in stuck)
            assert await worker.link_to("127.0.0.1", good_port, True) is link  # pooled
            stuck[0].cancel()  # one waiter goes away (its client hung up)...
            for task in stuck[1:]:  # ...the others still get the connect's own outcome
                with pytest.raises(ConnectError, match=f"127.0.0.1:{blackhole}"):
                    await task
            assert stuck[0].cancelled()
            assert calls.count(blackhole) == 1  # one connect shared by all three
            with pytest.raises(ConnectError):  # nothing cached: a later prefill tries again
                await worker.link_to("127.0.0.1", blackhole, True)
            assert calls.count(blackhole) == 2
        finally:
            await worker.stop()
