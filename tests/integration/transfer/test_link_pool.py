"""``transfer.link_pool.LinkPool`` over loopback: links keyed by destination, route and key id;
one pacer per destination link (shared by its receivers) under the process's egress cap; a
re-rated route is paced and estimated afresh; one reading per destination link; a dropped link
is replaced, a stale drop leaves the new one alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from prfaas.spec import CacheSpec, DType, LayerCache
from prfaas.transfer import ConnectError, Manifest, Receiver, TransferConfig
from prfaas.transfer.link_pool import DEPLOYMENT_KEY, Destination, LinkPool

pytestmark = pytest.mark.timeout(60)

KEY = b"link-pool-test-key-0123456789"
SPEC = CacheSpec(tuple(LayerCache.gqa(1, 16, DType.FP32) for _ in range(2)))


def _allocate(manifest: Manifest) -> list[bytearray]:
    return [bytearray(layer.num_bytes) for layer in manifest.layers]


@pytest.fixture
async def receivers() -> AsyncIterator[list[int]]:
    """Two receivers (the ports of two decode nodes of one site)."""
    async with (
        Receiver(TransferConfig(psk=KEY, name="rx0"), _allocate) as rx0,
        Receiver(TransferConfig(psk=KEY, name="rx1"), _allocate) as rx1,
    ):
        ports = [(await rx.listen("127.0.0.1", 0))[1] for rx in (rx0, rx1)]

        async def consume(rx: Receiver) -> None:
            async for session in rx:
                await session.complete()

        tasks = [asyncio.create_task(consume(rx)) for rx in (rx0, rx1)]
        yield ports
        for t in tasks:
            t.cancel()


async def test_links_are_keyed_by_destination_route_and_key(receivers: list[int]) -> None:
    port = receivers[0]
    pool = LinkPool("tx", {DEPLOYMENT_KEY: KEY, "tenant-a": KEY})
    pool.set_route("pf->pd", 1e6, 1e6)
    try:
        cross = Destination("127.0.0.1", port, "pf->pd")
        local = Destination("127.0.0.1", port, None)
        other_key = Destination("127.0.0.1", port, "pf->pd", "tenant-a")
        a, b, c = [await pool.link_to(d) for d in (cross, local, other_key)]
        assert len({id(a), id(b), id(c)}) == 3
        assert await pool.link_to(cross) is a  # pooled
        assert a.rate_bytes_per_s == 1e6 and b.rate_bytes_per_s is None  # the route decides
        with pytest.raises(ConnectError, match="no key with id 'nobody'"):
            await pool.link_to(Destination("127.0.0.1", port, None, "nobody"))
        manifest = Manifest.from_layout("r1", SPEC.layout(8, 0))
        async with a.session(manifest) as s:
            for i, layer in enumerate(manifest.layers):
                await s.send(i, 0, memoryview(bytearray(layer.num_bytes)))
            await s.finish()
        # A stale drop (another link) leaves the pooled one; a real one replaces it.
        await pool.drop(cross, b)
        assert await pool.link_to(cross) is a
        await pool.drop(cross, a)
        assert await pool.link_to(cross) is not a
        assert pool.acked_bytes() >= manifest.num_bytes  # the dropped link's count
    finally:
        await pool.aclose()


async def test_one_pacer_per_destination_link_under_the_cap_and_re_rating(
    receivers: list[int],
) -> None:
    pool = LinkPool("tx", {DEPLOYMENT_KEY: KEY}, egress_cap_bytes_per_s=3e6)
    pool.set_route("pf->pd", 2e6, 2e6)
    pool.set_route("pf->pd2", 5e6, 5e6)
    try:
        x0, x1 = [await pool.link_to(Destination("127.0.0.1", p, "pf->pd")) for p in receivers]
        y = await pool.link_to(Destination("127.0.0.1", receivers[0], "pf->pd2"))
        assert x0._bucket is x1._bucket and x0._bucket is not y._bucket  # shared per link
        assert x0.rate_bytes_per_s == 2e6 and y.rate_bytes_per_s == 3e6  # the cap holds y
        (before,) = [r for r in pool.reports() if r.link == "pf->pd"]
        assert (before.basis, before.capacity_bytes_per_s) == ("configured", 2e6)
        pool.set_route("pf->pd", 1e6, 1e6)  # re-shaped: paced and estimated afresh
        assert x0.rate_bytes_per_s == 1e6 and x1.rate_bytes_per_s == 1e6
        assert y.rate_bytes_per_s == 3e6
        pool.sample(asyncio.get_running_loop().time())
        after = pool.report("pf->pd")
        assert after is not None and after.configured_bytes_per_s == 1e6
        assert after.pace_bytes_per_s == 1e6 and after.basis == "configured"
        assert {r.link for r in pool.reports()} == {"pf->pd", "pf->pd2"}
        pool.set_route("pf->pd", None, 1e6)  # unpaced (tbf shapes the link): the cap alone
        assert x0.rate_bytes_per_s == 3e6
    finally:
        await pool.aclose()


async def test_a_reload_closes_the_links_of_a_withdrawn_or_changed_key(
    receivers: list[int],
) -> None:
    port = receivers[0]
    pool = LinkPool("tx", {DEPLOYMENT_KEY: KEY, "tenant-a": KEY, "tenant-b": KEY})
    try:
        dests = [Destination("127.0.0.1", port, None, k) for k in (DEPLOYMENT_KEY, "tenant-a",
                                                                    "tenant-b")]  # fmt: skip
        kept, revoked, rotated = [await pool.link_to(d) for d in dests]
        assert (
            await pool.set_keys({DEPLOYMENT_KEY: KEY, "tenant-b": b"another-key-0123456789"}) == 2
        )
        assert await pool.link_to(dests[0]) is kept
        with pytest.raises(ConnectError, match="no key with id 'tenant-a'"):
            await pool.link_to(dests[1])
        manifest = Manifest.from_layout("r1", SPEC.layout(8, 0))
        with pytest.raises(Exception):  # noqa: B017 - closed: whatever it raises, nothing is sent
            async with revoked.session(manifest) as s:
                await s.send(0, 0, memoryview(bytearray(manifest.layers[0].num_bytes)))
        # tenant-b's link was closed: the next one connects with the new key, which this
        # receiver does not hold, so it is refused rather than reusing the old link.
        with pytest.raises(ConnectError):
            await pool.link_to(dests[2])
        assert rotated is not None
    finally:
        await pool.aclose()
