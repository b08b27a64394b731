"""A pool node paces each tenant's KV on a route of its own (``PoolNodeHost.route_of``): the
tenant's told rate converted to wall payload bytes/s as the site's link is (byte_divisor and
time_scale of a timed engine), every route under the pool's egress as the process's cap; a
tenant that told no rate is unpaced by it (the cap alone); a route is set again only when its
tenant's rate changes; ``netns: true`` paces nothing; a two-site deployment's node keeps its one
link. Construction only: no process, no socket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prfaas.config import DeploymentConfig
from prfaas.pool.nodes_file import group_deployment
from prfaas.pool.tenant_links import tenant_route
from prfaas.pool_file import load_pool
from prfaas.serve.node.host import WorkerHost
from prfaas.serve.node.hosting import LinkRateRefused
from prfaas.serve.node.messages import PrefillCommand, SamplingMsg
from prfaas.serve.node.pool_host import PoolNodeHost

pytestmark = pytest.mark.timeout(60)

POOL = Path(__file__).resolve().parents[2] / "examples" / "pool" / "pool.yaml"
WALL_SCALE = 1000 * 0.1
"""examples/pool: byte_divisor 1000, time_scale 0.1: a modelled byte/s is 1/100 payload byte/s."""


def _pool_node(netns: bool = False) -> PoolNodeHost:
    pool = load_pool(POOL)
    group = pool.groups[0]  # g-1t, timed paper-1t
    d = group_deployment(pool, group, "p" * 32)
    if netns:
        d = DeploymentConfig.model_validate({**d.model_dump(), "netns": True})
    return PoolNodeHost(d, list(group.node_names), "http://127.0.0.1:9",
                        pool_egress_gbps=pool.egress_gbps)  # fmt: skip


def _cmd(tenant: str, gbps: float | None, cross_site: bool = True) -> PrefillCommand:
    return PrefillCommand(
        request_id="r", tokens="", decode_node="d", decode_host="127.0.0.1",
        decode_transfer_port=1, cross_site=cross_site, sampling=SamplingMsg(max_new_tokens=1),
        key_id="a-1", tenant=tenant, tenant_link_gbps=gbps,
    )  # fmt: skip


def _paces(host: WorkerHost) -> dict[str, float | None]:
    return {r.link: r.pace_bytes_per_s for r in host.links.reports()}


def test_each_tenant_is_paced_on_its_own_route_at_its_own_rate_under_the_egress_cap() -> None:
    host = _pool_node()
    assert host.egress_cap_bytes_per_s() == pytest.approx(100e9 / 8 / WALL_SCALE)  # egress 100
    assert _paces(host) == {}  # the group's one link is not a route of its own here
    assert host.route_of(_cmd("tenant-a", 40.0)) == tenant_route("g-1t", "tenant-a")
    assert host.route_of(_cmd("tenant-b", None)) == "g-1t->tenant-b"
    assert _paces(host) == {
        "g-1t->tenant-a": pytest.approx(40e9 / 8 / WALL_SCALE),
        "g-1t->tenant-b": None,  # told no rate: the egress cap alone paces it
    }
    # The heartbeat's readings are modelled units again: the tenant's own rate.
    (a,) = [r for r in host.link_reports() if r.link == "g-1t->tenant-a"]
    assert a.pace_bytes_per_s == pytest.approx(40e9 / 8)
    assert a.configured_bytes_per_s == pytest.approx(40e9 / 8) and a.basis == "configured"
    assert host.route_of(_cmd("tenant-a", 40.0, cross_site=False)) is None  # within the site


def test_a_route_is_set_again_only_when_its_tenants_rate_changes() -> None:
    host = _pool_node()
    calls: list[tuple[str, float | None]] = []
    set_route = host.links.set_route

    def counting(route: str, pace: float | None, configured: float | None) -> None:
        calls.append((route, pace))
        set_route(route, pace, configured)

    host.links.set_route = counting  # type: ignore[method-assign]
    for _ in range(3):
        host.route_of(_cmd("tenant-a", 40.0))
    host.route_of(_cmd("tenant-a", 10.0))
    host.route_of(_cmd("tenant-a", 10.0))
    assert calls == [
        ("g-1t->tenant-a", pytest.approx(40e9 / 8 / WALL_SCALE)),
        ("g-1t->tenant-a", pytest.approx(10e9 / 8 / WALL_SCALE)),
    ]


def test_netns_paces_nothing_and_the_pool_nodes_link_is_not_reshaped() -> None:
    host = _pool_node(netns=True)
    assert host.egress_cap_bytes_per_s() is None
    host.route_of(_cmd("tenant-a", 40.0))
    (a,) = host.links.reports()
    assert a.pace_bytes_per_s is None  # tbf shapes the link there
    assert a.configured_bytes_per_s == pytest.approx(40e9 / 8 / WALL_SCALE)  # still estimated
    with pytest.raises(LinkRateRefused):
        asyncio.run(_pool_node().set_link_gbps(5.0))


def test_a_two_site_node_keeps_its_one_link_whatever_a_command_says() -> None:
    """A deployment's ``WorkerHost`` (``prfaas up`` of a deployment) is unchanged: no cap, the
    site's one link paced at the file's rate, and a command naming no tenant takes it."""
    pool = load_pool(POOL)
    group = pool.groups[0]
    d = group_deployment(pool, group, "p" * 32)
    host = WorkerHost(d, list(group.node_names), "http://127.0.0.1:9")
    assert host.egress_cap_bytes_per_s() is None
    assert _paces(host) == {"g-1t->g-1t-tenants": pytest.approx(100e9 / 8 / WALL_SCALE)}
    assert host.route_of(_cmd("", None)) is None
    dest = host._destination("127.0.0.1", 1, True, "", host.route_of(_cmd("", None)))
    assert dest.route == "g-1t->g-1t-tenants"
