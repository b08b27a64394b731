"""``ElasticLoop``: the elastic pool's live loop under ``prfaas up`` (a file with ``autoscale:``).
Every ``tick_s``: spot preemptions are given (the simulator's preemption events, live: while a
spot group's availability trace says 0, each of its nodes gets its notice and none is added; a
group with ``mttp_s`` gives each of its nodes its notice at the time drawn for it when the loop
first saw it, ``PreemptionConfig.notice_at_s``, from a generator seeded with the file's
``workload.seed`` as the simulator's), the provider moves its nodes along
(``LocalProvider.poll``), the observer reads the gateway (``LiveObserver``), the controller asks
the autoscaler and acts (``ElasticController.tick``), and the decision goes to the gateway
(``POST /internal/autoscale``: ``/metrics``' ``prfaas_autoscale_desired_nodes{group}`` and
decisions counter, ``prfaas status``).

The clock: the loop's seconds are wall seconds (``time.monotonic``), counted from its start (one
tick before its first look: ``started_s``) for the trace, as the observer's offered rate is;
every ``autoscale:`` figure of the file (``tick_s``, cooldowns, ``startup_s``, ``notice_s``, a
trace's ``interval_s``, ``mttp_s``) is read in them, whatever the engine's ``time_scale``. The
simulator of a live emulated run restates them all in modelled seconds in one place
(``sim/elastic/wall_clock.in_modelled_seconds``), not here.
One thread; a failed look is logged and the next one tries again.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from prfaas.policy.autoscaler import Autoscaler
from prfaas.policy.pool_actions import GroupKind
from prfaas.serve.elastic.controller import ElasticController
from prfaas.serve.elastic.local import LocalGroup, LocalProvider
from prfaas.serve.elastic.observe import LiveObserver
from prfaas.serve.elastic.provider import NodePhase

if TYPE_CHECKING:
    from prfaas.sim.elastic import PreemptionConfig

log = logging.getLogger("prfaas.elastic")


class ElasticLoop:
    def __init__(self, launcher: Any) -> None:
        d = launcher.deployment
        auto = d.autoscale
        assert auto is not None
        sites = [s.name for s in d.sites if s.kind == "prfaas"]
        site = auto.site or sites[0]
        self.launcher = launcher
        self.tick_s = auto.tick_s
        groups = [LocalGroup(g.name, g.startup_s, g.spot, g.initial_nodes) for g in auto.groups]
        self.provider = LocalProvider(launcher, site, groups, time.monotonic)
        self.observer = LiveObserver(
            site, d.policy.threshold_tokens or 8192, {g.name: g.startup_s for g in auto.groups},
            auto.rate_window_s, auto.tick_s,
        )  # fmt: skip
        kinds = [GroupKind(g.name, g.spot) for g in auto.groups]
        self._spot: dict[str, tuple[PreemptionConfig, float]] = {
            g.name: (g.preemption.build(), g.notice_s) for g in auto.groups if g.spot
        }
        """Spot groups: (their preemptions, a trace and/or a rate; the group's notice)."""
        self._rng = random.Random(d.workload.seed)
        """The rate's draws: the simulator's generator (``ElasticScenario.seed``, the file's
        ``workload.seed``), drawn in the same order (the nodes' launch order)."""
        self._drawn: set[str] = set()
        self._notice_at_s: dict[str, float] = {}
        """Spot nodes of a rate-preempted group -> when their notice comes (loop seconds)."""
        self.started_s: float | None = None
        """The loop's start (``time.monotonic``), one tick before its first look: the origin of
        the spot traces and of the observer's offered rate, the time 0 of a simulation of this
        run (whose first look of the autoscaler, at 0, sees nothing yet)."""
        self._now_s = 0.0
        self.num_preempted = 0
        """Notices given, from a trace or a rate (the simulator's ``num_preemptions``)."""
        self.preempted: dict[str, int] = {g: 0 for g in self._spot}
        """The same per spot group (each report to the gateway carries it: ``/metrics``)."""
        self.controller = ElasticController(
            Autoscaler(auto.policy()), self.provider, kinds, spot_available=self._available
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop_s(self) -> float:
        """Seconds since the loop's start: its clock for the spot preemptions (wall seconds;
        see the module's docstring)."""
        return 0.0 if self.started_s is None else self._now_s - self.started_s

    def _available(self, group: str) -> bool:
        """Whether the group's spot capacity is there now (its trace, from the loop's start)."""
        spot = self._spot.get(group)
        return spot is None or spot[0].available(self._loop_s())

    def _preempt(self, name: str, group: str, notice_s: float) -> None:
        self.provider.preempt(name, notice_s)
        self.num_preempted += 1
        self.preempted[group] += 1
        self.observer.num_lost += 1  # a decision in flight counts the loss, as simulated

    def _replay(self) -> None:
        """The simulator's availability events, live: while a spot group's trace says 0, each
        of its nodes gets its notice (``LocalProvider.preempt``) and none is added (the
        controller falls back to an on-demand group, counted)."""
        for group, (_, notice_s) in self._spot.items():
            if self._available(group):
                continue
            for n in self.provider.nodes():
                if n.group == group and n.phase in (NodePhase.STARTING, NodePhase.SERVING):
                    self._preempt(n.name, group, notice_s)

    def _rate_notices(self) -> None:
        """The simulator's rate of preemptions, live: each node of a spot group with
        ``mttp_s`` has its notice time drawn at the loop's first look at it (in the order the
        nodes were added: the simulator's order of draws), from when it was asked for; at the
        first look at or after that time it gets its notice if still starting or serving (one
        drained by the autoscaler meanwhile is not noticed: the simulator notices it if it is
        still finishing its prefill)."""
        assert self.started_s is not None
        now_s = self._loop_s()
        nodes = self.provider.nodes()
        for n in nodes:
            spot = self._spot.get(n.group)
            if spot is None or n.name in self._drawn:
                continue
            self._drawn.add(n.name)
            # An initial node was asked for just before the loop's start: the simulator's 0.
            at_s = spot[0].notice_at_s(self._rng, max(0.0, n.started_s - self.started_s))
            if at_s is not None:
                self._notice_at_s[n.name] = at_s
                log.info("%s: spot notice drawn for %.1f s from now (mttp %g s)", n.name,
                         at_s - now_s, spot[0].mttp_s)  # fmt: skip
        listed = {n.name for n in nodes}
        for name in [m for m in self._notice_at_s if m not in listed]:
            del self._notice_at_s[name]  # gone before its notice
        for n in nodes:
            at_s = self._notice_at_s.get(n.name)
            if at_s is None or at_s > now_s:
                continue
            del self._notice_at_s[n.name]
            if n.phase in (NodePhase.STARTING, NodePhase.SERVING):
                self._preempt(n.name, n.group, self._spot[n.group][1])

    def look(self) -> None:
        """One look: the spot notices (rate, then trace), poll, observe, decide, act."""
        self._now_s = time.monotonic()
        if self.started_s is None:  # the first look comes one tick after the start
            self.started_s = self._now_s - self.tick_s
        self._rate_notices()
        self._replay()
        self.provider.poll()
        now = time.monotonic()
        obs = self.observer.observe(
            self.launcher.nodes(), self.launcher.routes(), self.provider.nodes(), now
        )
        d = self.controller.tick(obs, now)
        self.launcher.control.report_autoscale(
            {"group": d.group, "action": d.action.value, "num_nodes": d.num_nodes,
             "desired_nodes": d.desired_nodes, "reason": d.reason, "code": d.code,
             "at_unix_s": time.time(), "num_serving": obs.num_serving,
             "num_starting": obs.num_starting, "num_draining": obs.num_draining,
             "preemptions": dict(self.preempted)}
        )  # fmt: skip

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.look()
            except Exception:  # a gateway restarting, say: the next look tries again
                log.exception("elastic loop")

    def start(self) -> None:
        """The groups' ``initial_nodes`` (the simulator's nodes there at 0), then the looks."""
        for g in self.provider.groups.values():
            for _ in range(g.initial_nodes):
                self.provider.add(g.name, initial=True)
        self._thread = threading.Thread(target=self._run, name="elastic", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
