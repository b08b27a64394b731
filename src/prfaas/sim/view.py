"""``SimClusterView``: the ``ClusterView`` the simulator hands its policies.

It reads the ``World`` on demand (a ``NodeLoad`` or ``LinkState`` snapshot is built only when a
policy asks), so nothing is rebuilt per event; ``least_loaded`` answers from each pool's heap in
O(log n) (the ``IndexedClusterView`` extension of ``policy.placement``). One view per PD site:
the threshold ``t`` is that site's. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from prfaas.core.ids import NodeId, SiteId
from prfaas.core.topology import NodeRole, SiteKind
from prfaas.core.views import LinkState, NodeLoad
from prfaas.sim.nodes import PrefillNode, SimNode
from prfaas.sim.world import World

_DECODE = NodeRole.DECODE
"""A module constant: reading an enum member off its class costs ~150 ns on Python 3.11 (the
metaclass's lookup), and the routers and the decode placement ask this view once a request."""


class SimClusterView:
    def __init__(self, world: World, threshold_tokens: int) -> None:
        self._world = world
        self._threshold = threshold_tokens
        # Each site's pools by site id (the pools are never replaced, only changed): one dict
        # lookup per placement or routing question instead of an index and two list lookups.
        self._prefill_pools = dict(zip(world.site_ids, world.pools.prefill, strict=True))
        self._decode_pools = dict(zip(world.site_ids, world.pools.decode, strict=True))

    def site_ids(self) -> Sequence[SiteId]:
        return self._world.site_ids

    def site_kind(self, site_id: SiteId) -> SiteKind:
        w = self._world
        return w.site_kinds[w.site_index[site_id]]

    def nodes(self, site_id: SiteId, role: NodeRole) -> Sequence[NodeLoad]:
        w = self._world
        now = w.now
        site = w.site_index[site_id]
        return tuple(n.load(now) for n in w.nodes if n.site == site and n.role is role)

    def node(self, node_id: NodeId) -> NodeLoad:
        w = self._world
        return w.node_by_id[node_id].load(w.now)

    def link(self, src_site: SiteId, dst_site: SiteId) -> LinkState | None:
        w = self._world
        link = w.link_by_name.get((src_site, dst_site))
        return None if link is None else link.state(w.now)

    def least_loaded(self, site_id: SiteId, role: NodeRole) -> NodeLoad | None:
        node: SimNode | None
        if role is _DECODE:
            dpool = self._decode_pools.get(site_id)
            node = None if dpool is None else dpool.best()
        else:
            ppool = self._prefill_pools.get(site_id)
            node = None if ppool is None else ppool.best()
        return None if node is None else node.load(self._world.now)

    def least_loaded_id(self, site_id: SiteId, role: NodeRole) -> NodeId | None:
        """``least_loaded``'s node, without building its ``NodeLoad`` (decode placement runs
        once per request)."""
        node: SimNode | None
        if role is _DECODE:
            dpool = self._decode_pools.get(site_id)
            node = None if dpool is None else dpool.best()
        else:
            ppool = self._prefill_pools.get(site_id)
            node = None if ppool is None else ppool.best()
        return None if node is None else node.node_id

    def work_left_s(self, node_id: NodeId) -> float:
        """Seconds of assigned prefill work ``node_id`` has left (0 for a decode node)."""
        w = self._world
        node = w.node_by_id[node_id]
        if isinstance(node, PrefillNode):
            return max(0.0, node.free_at_s - w.now)
        return 0.0

    @property
    def threshold_tokens(self) -> int:
        return self._threshold

    def set_threshold_tokens(self, threshold_tokens: int) -> None:
        self._threshold = threshold_tokens
