"""Node choice inside one (site, role) pool.

A driver whose view can answer ``least_loaded(site, role)`` in O(log n) (the simulator's does)
is asked directly; any other ``ClusterView`` is scanned. "Least loaded" means the accepting node
that would start new work soonest: for prefill, least queued work; for decode, fewest requests
running, queued or reserved. Pure.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from prfaas.core.ids import NodeId, SiteId
from prfaas.core.topology import NodeRole
from prfaas.core.views import ClusterView, NodeLoad


@runtime_checkable
class IndexedClusterView(Protocol):
    """Optional extension of ``ClusterView`` for large deployments."""

    def least_loaded(self, site_id: SiteId, role: NodeRole) -> NodeLoad | None: ...

    def work_left_s(self, node_id: NodeId) -> float:
        """Seconds of prefill work queued at or running on ``node_id``."""
        ...


def _scan_key(load: NodeLoad) -> tuple[int, int, int]:
    return (load.queued_tokens, load.queue_depth + load.batch_size, load.batch_size)


def least_loaded(cluster: ClusterView, site_id: SiteId, role: NodeRole) -> NodeLoad | None:
    """The accepting node at ``site_id`` in ``role`` that would start new work soonest."""
    fast = getattr(cluster, "least_loaded", None)
    if fast is not None:
        result: NodeLoad | None = fast(site_id, role)
        return result
    best: NodeLoad | None = None
    for load in cluster.nodes(site_id, role):
        if load.accepting and (best is None or _scan_key(load) < _scan_key(best)):
            best = load
    return best


def has_accepting(cluster: ClusterView, site_id: SiteId, role: NodeRole) -> bool:
    return least_loaded(cluster, site_id, role) is not None


def work_left_s(cluster: ClusterView, load: NodeLoad, per_token_s: float) -> float:
    """Prefill work ahead of a new request at ``load``'s node: the driver's figure when its view
    has one, else queued tokens times a per-token estimate."""
    fast = getattr(cluster, "work_left_s", None)
    if fast is not None:
        result: float = fast(load.node_id)
        return result
    return load.queued_tokens * per_token_s
