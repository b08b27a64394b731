"""``SimClusterView``: the ``ClusterView`` the simulator hands its policies.

It reads the simulator's live state on demand (a ``NodeLoad`` or ``LinkState`` snapshot is built
only when a policy asks), so nothing is rebuilt per event; ``least_loaded`` answers from each
pool's heap in O(log n) (the ``IndexedClusterView`` extension of ``policy.placement``). One view
per PD site: the threshold ``t`` is that site's. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prfaas.core.ids import NodeId, SiteId
from prfaas.core.topology import NodeRole, SiteKind
from prfaas.core.views import LinkState, NodeLoad

if TYPE_CHECKING:
    from prfaas.sim.simulator import Simulator


class SimClusterView:
    def __init__(self, sim: Simulator, threshold_tokens: int) -> None:
        self._sim = sim
        self._threshold = threshold_tokens

    def site_ids(self) -> Sequence[SiteId]:
        return self._sim.site_ids

    def site_kind(self, site_id: SiteId) -> SiteKind:
        return self._sim.site_kinds[self._sim.site_index[site_id]]

    def nodes(self, site_id: SiteId, role: NodeRole) -> Sequence[NodeLoad]:
        sim = self._sim
        now = sim.now
        site = sim.site_index[site_id]
        return tuple(n.load(now) for n in sim.nodes if n.site == site and n.role is role)  # type: ignore[attr-defined]

    def node(self, node_id: NodeId) -> NodeLoad:
        sim = self._sim
        return sim.node_by_id[node_id].load(sim.now)  # type: ignore[attr-defined, no-any-return]

    def link(self, src_site: SiteId, dst_site: SiteId) -> LinkState | None:
        sim = self._sim
        link = sim.link_by_name.get((src_site, dst_site))
        return None if link is None else link.state(sim.now)

    def least_loaded(self, site_id: SiteId, role: NodeRole) -> NodeLoad | None:
        sim = self._sim
        pool = sim.pool(site_id, role)
        if pool is None:
            return None
        node = pool.best()
        return None if node is None else node.load(sim.now)  # type: ignore[attr-defined]

    def work_left_s(self, node_id: NodeId) -> float:
        sim = self._sim
        node = sim.node_by_id[node_id]
        free_at: float = getattr(node, "free_at_s", sim.now)
        return max(0.0, free_at - sim.now)

    @property
    def threshold_tokens(self) -> int:
        return self._threshold

    def set_threshold_tokens(self, threshold_tokens: int) -> None:
        self._threshold = threshold_tokens
