"""The deployment file a pool group's node processes run from (``prfaas up pool.yaml``).

A pool node is a PrfaaS node like any other (``serve.node.host.WorkerHost``, the node API of
``serve.node.app``): this turns one node group of the pool file into the deployment file its
process reads. The group is the file's PrfaaS site (its nodes prefill only); the other end of its
link is a PD site without nodes that stands for the tenants (the link's rate is the pool's
``egress_gbps``; its one decode node is named only, since a PD site must have one, and no
process runs it). The node process does not pace that one link: ``pool.node_main`` runs it as
a ``serve.node.pool_host.PoolNodeHost``, the egress a cap over per-tenant routes, each paced at
its tenant's own link.
The "gateway" is the front door's node listener (``front_door.control_port``): the nodes
register and heartbeat there, signed with the pool's internal key, which only the front door and
its nodes hold.

A node in a process of its own (a group with ``processes: per_node``, or with ``notice_s``; and
every Kubernetes pod, ``k8s.pool_entry``) runs from ``one_node_deployment``: the same file
holding only that node.
"""

from __future__ import annotations

from prfaas.config import (
    DeploymentConfig,
    EngineConfig,
    GatewayConfig,
    NodeConfig,
    SiteConfig,
)
from prfaas.core.link_config import LinkConfig
from prfaas.pool_sections import PoolFileConfig, PoolGroup


def tenants_site(group: PoolGroup) -> str:
    return f"{group.name}-tenants"


def group_deployment(pool: PoolFileConfig, group: PoolGroup, internal_psk: str) -> DeploymentConfig:
    units = pool.units
    ports = {n.name: n.port for n in group.nodes}
    nodes = [NodeConfig(name=n, role="prefill", port=ports.get(n, 0)) for n in group.node_names]
    door = pool.front_door
    return DeploymentConfig(
        engine=EngineConfig(
            kind=group.kind,
            model=group.model,
            model_path=group.model_path,
            time_scale=units.time_scale,
            byte_divisor=units.byte_divisor,
            block_tokens=units.block_tokens,
            cpus=group.cpus,  # the node process pins itself to them (pool.node_main)
        ),
        gateway=GatewayConfig(host=door.host, port=door.port, control_port=door.control_port),
        sites=[
            # A PD site needs a decode node: one named, never started (no process hosts it).
            SiteConfig(
                name=tenants_site(group),
                kind="pd",
                hardware=group.hardware,
                nodes=[NodeConfig(name=f"{tenants_site(group)}-d0", role="decode")],
            ),
            SiteConfig(name=group.name, kind="prfaas", hardware=group.hardware, nodes=nodes),
        ],
        links=[LinkConfig(src=group.name, dst=tenants_site(group), gbps=pool.egress_gbps)],
        psk=internal_psk,
        heartbeat_interval_s=pool.heartbeat_interval_s,
    )


def one_node_deployment(
    pool: PoolFileConfig,
    group: PoolGroup,
    node: str,
    internal_psk: str,
    port: int | None = None,
    transfer_port: int = 0,
) -> DeploymentConfig:
    """``group``'s node deployment file hosting ``node`` only (its own process): at ``port``
    (None: the pool file's, 0 there picks a free one) and ``transfer_port``."""
    if node not in group.node_names:
        raise ValueError(f"group {group.name} has no node {node!r}")
    d = group_deployment(pool, group, internal_psk)
    listed = {n.name: n.port for n in group.nodes}
    mine = NodeConfig(
        name=node,
        role="prefill",
        port=listed.get(node, 0) if port is None else port,
        transfer_port=transfer_port,
    )
    sites = [s.model_copy(update={"nodes": [mine]}) if s.name == group.name else s for s in d.sites]
    return d.model_copy(update={"sites": sites})
