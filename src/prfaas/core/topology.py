"""Topology: sites (datacenters), nodes (serving instances) and the links between sites.

A *site* is a cluster in one datacenter; a *node* is one serving process (an instance of P GPUs in
production); a *link* joins two sites in one direction and has a bandwidth and an RTT. Pure data.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from prfaas.core.ids import LinkId, NodeId, SiteId, link_id_for


class SiteKind(enum.Enum):
    PRFAAS = "prfaas"
    """A compute-dense, prefill-only cluster: a stateless KV producer."""
    PD = "pd"
    """A local prefill/decode cluster that can serve a request end to end."""


class NodeRole(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class Site:
    site_id: SiteId
    kind: SiteKind
    hardware: str
    """Name of the hardware preset its nodes run on (e.g. ``h200``)."""


@dataclass(frozen=True, slots=True)
class Node:
    node_id: NodeId
    site_id: SiteId
    role: NodeRole
    hardware: str


@dataclass(frozen=True, slots=True)
class Link:
    """A directed link between two sites."""

    src_site: SiteId
    dst_site: SiteId
    bandwidth_gbps: float
    """Capacity in Gbit/s (1e9 bit/s)."""
    rtt_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth_gbps > 0:
            raise ValueError(
                f"link {self.src_site}->{self.dst_site}: bandwidth must be > 0 Gbps, "
                f"got {self.bandwidth_gbps}"
            )
        if self.rtt_s < 0:
            raise ValueError(f"link {self.src_site}->{self.dst_site}: negative RTT {self.rtt_s}")

    @property
    def link_id(self) -> LinkId:
        return link_id_for(self.src_site, self.dst_site)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8


@dataclass(frozen=True, slots=True)
class Topology:
    """Sites, nodes and links of one deployment, validated for consistency."""

    sites: tuple[Site, ...]
    nodes: tuple[Node, ...]
    links: tuple[Link, ...] = ()

    def __post_init__(self) -> None:
        site_ids = [s.site_id for s in self.sites]
        if len(set(site_ids)) != len(site_ids):
            raise ValueError(f"duplicate site ids in {site_ids}")
        node_ids = [n.node_id for n in self.nodes]
        if len(set(node_ids)) != len(node_ids):
            raise ValueError("duplicate node ids")
        known = set(site_ids)
        for n in self.nodes:
            if n.site_id not in known:
                raise ValueError(f"node {n.node_id} is at unknown site {n.site_id}")
        for link in self.links:
            for end in (link.src_site, link.dst_site):
                if end not in known:
                    raise ValueError(f"link {link.link_id} names unknown site {end}")

    @property
    def site_by_id(self) -> Mapping[SiteId, Site]:
        return MappingProxyType({s.site_id: s for s in self.sites})

    @property
    def link_by_id(self) -> Mapping[LinkId, Link]:
        return MappingProxyType({link.link_id: link for link in self.links})

    def nodes_at(self, site_id: SiteId, role: NodeRole | None = None) -> tuple[Node, ...]:
        return tuple(
            n for n in self.nodes if n.site_id == site_id and (role is None or n.role is role)
        )

    def link(self, src_site: SiteId, dst_site: SiteId) -> Link | None:
        return self.link_by_id.get(link_id_for(src_site, dst_site))

    def with_nodes(self, nodes: Iterable[Node]) -> Topology:
        return Topology(self.sites, tuple(nodes), self.links)

    def node(self, node_id: NodeId) -> Node:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"unknown node {node_id}")
