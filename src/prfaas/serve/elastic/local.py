"""``LocalProvider``: an elastic pool's nodes as processes on this machine, through the
supervisor's desired set (``Launcher.add_node`` / ``Launcher.remove``).

- ``add(group)``: a node named ``SITE-GROUP-N`` (N counts up, never reused) joins the PrfaaS site
  on a free port and starts. It is held out of rotation (drained at the gateway at the first poll
  after it registered: it may take work for up to one poll period before) until both its group's
  ``startup_s`` has passed and it is ready (registered and reporting), then resumed; both times
  are logged. ``add(group, initial=True)``: one of the group's ``initial_nodes``, there from the
  start as the simulator's are (``ready_now``): serving once ready, its ``startup_s`` not held.
- ``drain(name)``: out of rotation at once; once the gateway has nothing in flight at it (or its
  ``deadline_s`` passed) it is removed from the desired set and stopped.
- ``preempt(name, notice_s)``: its spot capacity went (a replayed availability trace, or the
  notice drawn from its group's rate: ``ElasticLoop``): the node gets its notice at once
  (SIGTERM: it finishes what ends before the deadline and hands the rest back) and is reclaimed
  at the deadline (SIGKILL if still there), out of the desired set so nothing restarts it; in a
  thread of its own, the loop goes on meanwhile.
- ``poll()`` moves nodes along (call it before each ``nodes()``): held -> serving,
  draining -> gone. ``nodes()`` lists the nodes not gone with their phase.

The gateway's listing (``ControlClient.nodes``) is the source of readiness and in-flight work.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from prfaas.serve.elastic.provider import NodePhase, ProvidedNode

log = logging.getLogger("prfaas.elastic")
RECLAIM_MARGIN_S = 1.0
"""A preempted node is killed this long after its notice's deadline (its own handling ends it at
the deadline: the margin is for the process's exit, not more work)."""


@dataclass(frozen=True, slots=True)
class LocalGroup:
    name: str
    startup_s: float
    spot: bool = False
    initial_nodes: int = 0


class LocalProvider:
    def __init__(
        self,
        launcher: Any,
        site: str,
        groups: Sequence[LocalGroup],
        clock: Callable[[], float],
    ) -> None:
        self.launcher = launcher
        self.site = site
        self.groups = {g.name: g for g in groups}
        self.clock = clock
        self._numbers = itertools.count()
        self._nodes: dict[str, ProvidedNode] = {}
        self._deadlines: dict[str, float | None] = {}
        self._held: set[str] = set()
        """Nodes drained at the gateway by this provider while they start."""
        self._initial: set[str] = set()
        """Nodes of the groups' ``initial_nodes``: no modelled start-up to hold them for."""
        self._reclaims: dict[str, threading.Thread] = {}
        """Preempted nodes, each reclaimed by a thread (its notice, then the deadline)."""

    def add(self, group: str, initial: bool = False) -> str:
        g = self.groups[group]
        name = f"{self.site}-{g.name}-{next(self._numbers)}"
        if initial:
            self._initial.add(name)
        self.launcher.add_node(self.site, name)
        self._nodes[name] = ProvidedNode(name, g.name, g.spot, NodePhase.STARTING,
                                         started_s=self.clock())  # fmt: skip
        log.info("%s: starting (group %s, start-up %g s)", name, g.name, g.startup_s)
        return name

    def drain(self, name: str, deadline_s: float | None = None) -> None:
        node = self._nodes[name]
        self._deadlines[name] = deadline_s
        self._nodes[name] = replace(node, phase=NodePhase.DRAINING)
        try:
            self.launcher.control.drain(name)
        except Exception as exc:  # not registered yet: it is removed at the next poll
            log.info("%s: drain before registration (%s)", name, exc)

    def preempt(self, name: str, notice_s: float) -> None:
        node = self._nodes[name]
        self._nodes[name] = replace(node, phase=NodePhase.DRAINING)
        self._deadlines[name] = self.clock() + notice_s
        log.warning("%s: spot capacity gone: notice, reclaimed within %g s", name, notice_s)
        reclaim = threading.Thread(target=self._reclaim, args=(name, notice_s),
                                   name=f"reclaim-{name}", daemon=True)  # fmt: skip
        self._reclaims[name] = reclaim
        reclaim.start()

    def _reclaim(self, name: str, notice_s: float) -> None:
        try:  # the node's own SIGTERM handling is the notice (serve/node/notice.py)
            self.launcher.remove(name, grace_s=notice_s + RECLAIM_MARGIN_S)
        except Exception:
            log.exception("%s: reclaim", name)

    def nodes(self) -> Sequence[ProvidedNode]:
        return [n for n in self._nodes.values() if n.phase is not NodePhase.GONE]

    def poll(self) -> None:
        rows = {r["node"]: r for r in self.launcher.nodes()}
        now = self.clock()
        for name, node in list(self._nodes.items()):
            row = rows.get(name)
            if node.phase is NodePhase.STARTING:
                self._starting(node, row, now)
            elif node.phase is NodePhase.SERVING and row is not None:
                busy = bool(row.get("in_flight", 0))
                if busy != node.busy:
                    self._nodes[name] = replace(node, busy=busy)
            elif node.phase is NodePhase.DRAINING and name in self._reclaims:
                if not self._reclaims[name].is_alive():
                    del self._reclaims[name]
                    self._nodes[name] = replace(node, phase=NodePhase.GONE)
                    log.info("%s: preempted and gone", name)
            elif node.phase is NodePhase.DRAINING:
                deadline = self._deadlines.get(name)
                idle = row is None or not row.get("in_flight", 0)
                if idle or (deadline is not None and now >= deadline):
                    self.launcher.remove(name)
                    self._nodes[name] = replace(node, phase=NodePhase.GONE)
                    log.info("%s: removed", name)

    def _starting(self, node: ProvidedNode, row: dict[str, Any] | None, now: float) -> None:
        if row is None:
            return  # not registered yet
        name = node.name
        startup_s = 0.0 if name in self._initial else self.groups[node.group].startup_s
        if now - node.started_s < startup_s:
            if name not in self._held:  # ready before its modelled start-up: hold it
                self.launcher.control.drain(name)
                self._held.add(name)
                log.info("%s: ready after %.1f s, held until %g s", name,
                         now - node.started_s, startup_s)  # fmt: skip
            return
        if name in self._held:
            self.launcher.control.resume(name)
            self._held.discard(name)
        log.info("%s: in rotation %.1f s after it was asked for (start-up %g s)", name,
                 now - node.started_s, startup_s)  # fmt: skip
        self._nodes[name] = replace(node, phase=NodePhase.SERVING, ready_s=now)
