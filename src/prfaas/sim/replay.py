"""``replay_decisions``: decision parity. A live gateway's decision log (``gateway.decision_log``,
records from ``policy.decision_log``) is fed, record by record and in order, to the policy
objects the simulator builds for the same deployment (``build_homes``: router, decode placement,
control policy); every logged output must come out again.

Each record's inputs are rebuilt (request view, cluster snapshot, ``now``): observations go into
the control policy's window, so its ticks read what the live one read. The gateway's fallback
router (local-only, after a lost prefill) is not the simulator's: a ``fallback`` route is asked
of ``make_router("local_only", ...)``, as the gateway builds it. Pure: takes the records, not the
file (``serve.gateway.decision_log.read_decision_log`` reads one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prfaas.core.ids import SiteId
from prfaas.core.topology import SiteKind
from prfaas.policy import NoRouteError, make_router
from prfaas.policy.decision_log import (
    Record,
    action_from,
    decision_from,
    request_from,
    view_from,
)
from prfaas.sim.homes import HomeSite, build_homes
from prfaas.sim.scenario import ScenarioError, SimScenario
from prfaas.sim.world import World


@dataclass(frozen=True, slots=True)
class Mismatch:
    index: int
    """The record's position in the log (0-based)."""
    kind: str
    logged: Any
    replayed: Any


@dataclass(frozen=True, slots=True)
class ReplayReport:
    num_records: int
    counts: dict[str, int] = field(default_factory=dict)
    """Records replayed, by kind (route, place, observe, tick)."""
    mismatches: tuple[Mismatch, ...] = ()

    @property
    def identical(self) -> bool:
        return not self.mismatches


def _home(world: World, homes: dict[int, HomeSite], home_site: str | None) -> HomeSite:
    if home_site is None:
        if len(homes) != 1:
            raise ScenarioError("several PD sites: name the one whose gateway logged")
        return next(iter(homes.values()))
    index = world.site_index.get(SiteId(home_site))
    if index is None or index not in homes:
        raise ScenarioError(f"{home_site!r} is not a PD site of the scenario")
    return homes[index]


def replay_decisions(
    records: Iterable[Record], scenario: SimScenario, home_site: str | None = None
) -> ReplayReport:
    """Replay ``records`` through the simulator's policy objects for ``scenario`` (the one
    ``scenarios.sim_scenario`` derives from the logging gateway's deployment)."""
    scenario.validate()
    world = World(scenario)
    home = _home(world, build_homes(world), home_site)
    site = world.site_ids[home.site]
    prfaas = [s for s, k in zip(world.site_ids, world.site_kinds, strict=True)
              if k is SiteKind.PRFAAS]  # fmt: skip
    fallback = make_router("local_only", site, prfaas)
    counts: dict[str, int] = {}
    mismatches: list[Mismatch] = []
    n = 0
    for i, rec in enumerate(records):
        n += 1
        kind = rec["kind"]
        counts[kind] = counts.get(kind, 0) + 1
        now = float(rec["now"])
        logged: Any
        got: Any
        if kind == "observe":
            home.control.observe(rec["uncached"], rec["output"], now)
            continue
        if kind == "route":
            router = home.router if rec["router"] == "primary" else fallback
            req = request_from(rec["request"])
            try:
                got = router.route(req, view_from(rec["view"]), now)
            except NoRouteError as exc:
                got = f"NoRouteError: {exc}"
            d = rec["decision"]
            logged = decision_from(d) if d is not None else f"NoRouteError: {rec['error']}"
        elif kind == "place":
            got = home.placement.choose(view_from(rec["view"]), SiteId(rec["site"]), now)
            logged = rec["node"]
        elif kind == "tick":
            got = home.control.tick(view_from(rec["view"]), now)
            logged = tuple(action_from(a) for a in rec["actions"])
        else:
            raise ValueError(f"record {i}: unknown kind {kind!r}")
        if got != logged:
            mismatches.append(Mismatch(i, kind, logged, got))
    return ReplayReport(n, counts, tuple(mismatches))
