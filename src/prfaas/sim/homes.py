"""``HomeSite``: the policy objects of one PD (home) site in a run: its router, the view they
read (with that site's threshold ``t``), its window of recent lengths, and its threshold tuner
and rebalancer when the scenario turns them on; ``build_homes`` makes them for a ``World``. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.core.topology import SiteKind
from prfaas.policy import LengthWindow, Rebalancer, ThresholdTuner, make_router
from prfaas.policy.router import Router
from prfaas.sim.view import SimClusterView
from prfaas.sim.world import World


@dataclass(frozen=True, slots=True)
class HomeSite:
    site: int
    """The site's number in the ``World``."""
    router: Router
    view: SimClusterView
    """What this site's policies read; it holds the site's threshold ``t``."""
    window: LengthWindow
    """Uncached prompt and output lengths of the site's recent requests (for Eqs. 3-8)."""
    tuner: ThresholdTuner | None
    """Re-searches ``t`` (on for the ``prfaas`` policy unless the scenario says otherwise)."""
    rebalancer: Rebalancer | None
    """Plans P<->D role changes (``rebalance`` on)."""


def build_homes(world: World) -> dict[int, HomeSite]:
    """One ``HomeSite`` per PD site, keyed by site number, in site order."""
    sc = world.sc
    ids = world.site_ids
    remote = [ids[i] for i, k in enumerate(world.site_kinds) if k is SiteKind.PRFAAS]
    remote_cm = world.cost_model(sc.sites[world.site_index[remote[0]]].hardware) if remote else None
    tune = sc.tune if sc.tune is not None else sc.policy == "prfaas"
    homes: dict[int, HomeSite] = {}
    for h, kind in enumerate(world.site_kinds):
        if kind is not SiteKind.PD:
            continue
        reach = [r for r in remote if (world.site_index[r], h) in world.links]
        local = world.cost_model(sc.sites[h].hardware)
        homes[h] = HomeSite(
            site=h,
            router=make_router(sc.policy, ids[h], reach, None, remote_cm, local),
            view=SimClusterView(world, sc.threshold_tokens),
            window=LengthWindow(),
            tuner=ThresholdTuner(ids[h], reach, remote_cm, local) if tune and reach else None,
            rebalancer=Rebalancer(ids[h], reach, remote_cm, local) if sc.rebalance else None,
        )
    return homes
