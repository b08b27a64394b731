"""Decision records: each policy call's inputs and output as a JSON-able dict, and back.

A driver that logs decisions (the live gateway with ``gateway.decision_log`` set) writes one
record per call, in call order: ``route`` (router: request view, cluster snapshot, ``now``, the
decision or the ``NoRouteError`` text), ``place`` (``DecodePlacement``: snapshot, site, node),
``observe`` (``ControlPolicy.observe``: the lengths a tick will read) and ``tick``
(``ControlPolicy.tick``: snapshot, actions). A replay (``sim/replay.py``) rebuilds each input with
the ``*_from`` functions and asks its own policy objects. A snapshot is a ``MutableClusterView``'s
content in the order the view listed it (ties between equal loads go to the first), so a rebuilt
view answers every policy exactly as the logged one did. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prfaas.core.ids import LinkId, NodeId, RequestId, SiteId
from prfaas.core.topology import NodeRole, SiteKind
from prfaas.core.views import ClusterView, LinkState, MutableClusterView, NodeLoad, RequestView
from prfaas.policy.control import ControlAction, SetThreshold
from prfaas.policy.decisions import CacheMove, RoleChange, RouteDecision

Record = dict[str, Any]
"""One line of a decision log (JSON object)."""


def snapshot(cluster: ClusterView) -> Record:
    sites = list(cluster.site_ids())
    nodes = [
        {**asdict(n), "role": n.role.value}
        for s in sites
        for role in (NodeRole.PREFILL, NodeRole.DECODE)
        for n in cluster.nodes(s, role)
    ]
    links = [
        asdict(state)
        for a in sites
        for b in sites
        if a != b and (state := cluster.link(a, b)) is not None
    ]
    return {
        "threshold_tokens": cluster.threshold_tokens,
        "sites": {s: cluster.site_kind(s).value for s in sites},
        "nodes": nodes,
        "links": links,
    }


def view_from(rec: Record) -> MutableClusterView:
    view = MutableClusterView(
        {SiteId(s): SiteKind(k) for s, k in rec["sites"].items()}, rec["threshold_tokens"]
    )
    for n in rec["nodes"]:
        view.update_node(
            NodeLoad(**{**n, "node_id": NodeId(n["node_id"]), "site_id": SiteId(n["site_id"]),
                        "role": NodeRole(n["role"])})
        )  # fmt: skip
    for lk in rec["links"]:
        view.update_link(LinkState(**{**lk, "link_id": LinkId(lk["link_id"])}))
    return view


def request_record(req: RequestView) -> Record:
    return {
        "request_id": req.request_id,
        "num_prompt_tokens": req.num_prompt_tokens,
        "cached_tokens_by_site": dict(req.cached_tokens_by_site),
        "block_hashes": list(req.block_hashes),
        "max_output_tokens": req.max_output_tokens,
    }


def request_from(rec: Record) -> RequestView:
    return RequestView(
        RequestId(rec["request_id"]),
        rec["num_prompt_tokens"],
        {SiteId(s): n for s, n in rec["cached_tokens_by_site"].items()},
        tuple(rec["block_hashes"]),
        rec["max_output_tokens"],
    )


def decision_record(d: RouteDecision) -> Record:
    return asdict(d)


def decision_from(rec: Record) -> RouteDecision:
    move = rec.get("cache_move")
    return RouteDecision(**{
        **rec,
        "prefill_site": SiteId(rec["prefill_site"]),
        "prefill_node": NodeId(rec["prefill_node"]),
        "cache_move": None if move is None else CacheMove(
            SiteId(move["src_site"]), SiteId(move["dst_site"]), move["num_tokens"]
        ),
    })  # fmt: skip


def action_record(a: ControlAction) -> Record:
    if isinstance(a, RoleChange):
        return {"role_change": {"node_id": a.node_id, "src_role": a.src_role.value,
                                "dst_role": a.dst_role.value}}  # fmt: skip
    return {"set_threshold": asdict(a)}


def action_from(rec: Record) -> ControlAction:
    if "role_change" in rec:
        c = rec["role_change"]
        return RoleChange(NodeId(c["node_id"]), NodeRole(c["src_role"]), NodeRole(c["dst_role"]))
    return SetThreshold(**rec["set_threshold"])


def route_record(
    router: str, req: RequestView, cluster: ClusterView, now: float,
    decision: RouteDecision | None, error: str | None,
) -> Record:  # fmt: skip
    """``router``: ``primary`` (the deployment's) or ``fallback`` (local-only, after a lost
    prefill)."""
    return {
        "kind": "route", "router": router, "now": now, "request": request_record(req),
        "view": snapshot(cluster),
        "decision": None if decision is None else decision_record(decision), "error": error,
    }  # fmt: skip


def place_record(cluster: ClusterView, site_id: SiteId, now: float, node: NodeId | None) -> Record:
    return {"kind": "place", "now": now, "site": site_id, "view": snapshot(cluster), "node": node}


def observe_record(num_uncached_tokens: int, num_output_tokens: int, now: float) -> Record:
    return {"kind": "observe", "now": now, "uncached": num_uncached_tokens,
            "output": num_output_tokens}  # fmt: skip


def tick_record(cluster: ClusterView, now: float, actions: tuple[ControlAction, ...]) -> Record:
    return {"kind": "tick", "now": now, "view": snapshot(cluster),
            "actions": [action_record(a) for a in actions]}  # fmt: skip
