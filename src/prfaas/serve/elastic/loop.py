"""``ElasticLoop``: the elastic pool's live loop under ``prfaas up`` (a file with ``autoscale:``).
Every ``tick_s``: a spot group's availability trace is replayed (while it says 0, its nodes get
their notice and none is added: the simulator's preemption events, live), the provider moves its
nodes along (``LocalProvider.poll``), the observer reads
the gateway (``LiveObserver``), the controller asks the autoscaler and acts
(``ElasticController.tick``), and the decision goes to the gateway (``POST /internal/autoscale``:
``/metrics``' ``prfaas_autoscale_desired_nodes{group}`` and decisions counter, ``prfaas status``).
One thread; a failed look is logged and the next one tries again.
"""

from __future__ import annotations

import logging
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
        groups = [LocalGroup(g.name, g.startup_s, g.spot) for g in auto.groups]
        self.provider = LocalProvider(launcher, site, groups, time.monotonic)
        self.observer = LiveObserver(
            site, d.policy.threshold_tokens or 8192, {g.name: g.startup_s for g in auto.groups},
            auto.rate_window_s, auto.tick_s,
        )  # fmt: skip
        kinds = [GroupKind(g.name, g.spot) for g in auto.groups]
        self._traces: dict[str, tuple[PreemptionConfig, float]] = {
            g.name: (g.preemption.build(), g.notice_s)
            for g in auto.groups if g.spot and g.preemption.trace is not None
        }  # fmt: skip
        """Spot groups whose availability trace is replayed: (the trace, the group's notice)."""
        self._started_s: float | None = None
        self._now_s = 0.0
        self.num_preempted = 0
        self.controller = ElasticController(
            Autoscaler(auto.policy()), self.provider, kinds, spot_available=self._available
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _available(self, group: str) -> bool:
        """Whether the group's spot capacity is there now (its trace, from the first look)."""
        replay = self._traces.get(group)
        if replay is None or self._started_s is None:
            return True
        return replay[0].available(self._now_s - self._started_s)

    def _replay(self) -> None:
        """The simulator's availability events, live: while a spot group's trace says 0, each
        of its nodes gets its notice (``LocalProvider.preempt``) and none is added (the
        controller falls back to an on-demand group, counted)."""
        for group, (_, notice_s) in self._traces.items():
            if self._available(group):
                continue
            for n in self.provider.nodes():
                if n.group == group and n.phase in (NodePhase.STARTING, NodePhase.SERVING):
                    self.provider.preempt(n.name, notice_s)
                    self.num_preempted += 1

    def look(self) -> None:
        """One look: poll, replay the spot traces, observe, decide, act."""
        self._now_s = time.monotonic()
        if self._started_s is None:
            self._started_s = self._now_s
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
             "num_starting": obs.num_starting, "num_draining": obs.num_draining}
        )  # fmt: skip

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.look()
            except Exception:  # a gateway restarting, say: the next look tries again
                log.exception("elastic loop")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="elastic", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
