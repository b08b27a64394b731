"""``HomeSite``: the policy objects of one PD (home) site in a run: its router, its decode
placement, the view they read (with that site's threshold ``t``), and its ``ControlPolicy``
(threshold tuner and rebalancer when the scenario turns them on, with the window of recent
lengths they read); ``build_homes`` makes them for a ``World``, as the live gateway makes its own
(``policy.control_policy``, ``policy.make_router``). Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prfaas.core.ids import NodeId
from prfaas.core.topology import SiteKind
from prfaas.policy import DecodePlacement, TuningConfig, make_router
from prfaas.policy.control import ControlPolicy, control_policy
from prfaas.policy.router import Router
from prfaas.sim.view import SimClusterView
from prfaas.sim.world import World


@dataclass(frozen=True, slots=True)
class HomeSite:
    site: int
    """The site's number in the ``World``."""
    router: Router
    placement: DecodePlacement
    view: SimClusterView
    """What this site's policies read; it holds the site's threshold ``t``."""
    control: ControlPolicy
    """Re-searches ``t`` (on for the ``prfaas`` policy unless the scenario says otherwise) and
    plans P<->D role changes (``rebalance`` on); owns the window of recent lengths."""
    choose_decode: Callable[[], NodeId | None]
    """``placement.choose(view, this site, now)``, resolved once (``DecodePlacement.chooser``):
    the arrival's hot path."""
    observe: Callable[[int, int, float], None] | None
    """``control.observe``, as one bound call (``ControlPolicy.observer``); None when the
    control policy is off (no tuner, no rebalancer): nothing reads its window then, so the
    arrival skips feeding it (a call and three list stores per request)."""


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
        placement = DecodePlacement()
        view = SimClusterView(world, sc.threshold_tokens)
        control = control_policy(
            ids[h], reach, remote_cm, local, tune=tune, rebalance=sc.rebalance,
            config=TuningConfig(min_samples=sc.tune_min_samples),
        )  # fmt: skip
        homes[h] = HomeSite(
            site=h,
            router=make_router(sc.policy, ids[h], reach, None, remote_cm, local),
            placement=placement,
            view=view,
            control=control,
            choose_decode=placement.chooser(view, ids[h]),
            observe=control.observer if control.active else None,
        )
    return homes
