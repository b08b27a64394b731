"""``DecodePlacement``: one rule for the decode node, answered the same by a scanned view (the
live gateway's) and the simulator's pool heaps, and asked by the simulator at routing time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prfaas.core import MutableClusterView, NodeLoad, NodeRole, SiteKind
from prfaas.core.ids import NodeId, SiteId
from prfaas.policy import DecodePlacement
from prfaas.policy.placement import decode_load_key
from prfaas.sim import Simulator, paper_deployment
from prfaas.sim.nodes import DecodeNode, PrefillNode
from prfaas.sim.scenario import LengthConfig, SimScenario

pytestmark = pytest.mark.timeout(60)

PD = SiteId("pd")


def _view(loads: list[tuple[int, int, bool]]) -> MutableClusterView:
    """Decode nodes d0.. with (queue_depth, batch_size, draining)."""
    v = MutableClusterView({PD: SiteKind.PD})
    for i, (depth, batch, draining) in enumerate(loads):
        v.update_node(
            NodeLoad(NodeId(f"d{i}"), PD, NodeRole.DECODE, queue_depth=depth, batch_size=batch,
                     draining=draining)
        )  # fmt: skip
    return v


def test_fewest_requests_held_wins_ties_to_the_first_and_draining_nodes_take_none() -> None:
    place = DecodePlacement()
    assert place.choose(_view([(0, 3, False), (1, 1, False), (0, 2, False)]), PD, 0.0) == "d1"
    assert place.choose(_view([(0, 2, False), (1, 1, False)]), PD, 0.0) == "d0"  # tie: first
    assert place.choose(_view([(0, 0, True), (0, 5, False)]), PD, 0.0) == "d1"
    assert place.choose(_view([(0, 0, True)]), PD, 0.0) is None
    assert decode_load_key(NodeLoad(NodeId("x"), PD, NodeRole.DECODE, 2, 99, 3)) == 5


def _scenario() -> SimScenario:
    sc = paper_deployment("paper-prfaas", rate_rps=50.0)
    home = replace(next(s for s in sc.sites if s.kind == "pd"), num_prefill=1, num_decode=3)
    return replace(
        sc, sites=(home,), links=(), policy="local_only", duration_s=1.0, prefix_cache=False,
        lengths=LengthConfig(kind="fixed", fixed_tokens=16384),
    )  # fmt: skip


def test_the_simulator_places_at_routing_time_with_the_policy_and_its_heap_agrees() -> None:
    sim = Simulator(_scenario())
    sim.run(until_s=0.5)  # 25 arrivals; one 16k prefill takes longer than that
    prefill = next(n for n in sim.nodes if isinstance(n, PrefillNode))
    decodes = [n for n in sim.nodes if isinstance(n, DecodeNode)]
    queued = list(prefill.queue)
    assert len(queued) >= 10  # their prefills have not started
    # Every queued request already holds a decode node, reserved, spread by the key.
    assert all(r.decode_node for r in queued)
    assert sum(d.reserved for d in decodes) == sim.metrics.num_arrived
    assert max(d.reserved for d in decodes) - min(d.reserved for d in decodes) <= 1
    # The heap's answer (the simulator's fast path) is the scan's answer on the same loads.
    home = next(iter(sim.homes.values())).view
    site = SiteId(sim.sc.sites[0].name)
    scanned = MutableClusterView({PD: SiteKind.PD})
    for load in home.nodes(site, NodeRole.DECODE):
        scanned.update_node(replace(load, site_id=PD))
    assert DecodePlacement().choose(home, site, sim.now) == DecodePlacement().choose(
        scanned, PD, sim.now
    )
