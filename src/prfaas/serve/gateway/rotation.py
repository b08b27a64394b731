"""``Rotation``: whether one node takes new work, and why not. No I/O, no clock (``now_s`` is
passed in, wall seconds of the gateway's monotonic clock); imports nothing from serve/.

A node is out of rotation for any of these reasons, each with its own way back:

- ``silent``: its heartbeats stopped (the registry's expiry). Back on its next heartbeat (a process
  started again re-registers).
- ``fault``: it reported one (its engine thread died, say). Back on a report without a fault.
- ``failed``: the gateway could not reach it (connection refused or reset). Back on a heartbeat
  that arrives after a quarantine that doubles with every failure since its last success (the retry
  budget: a crash-looping node that heartbeats between crashes does not keep taking requests).
- ``refused``: it answered "not now" (409: draining, changing role). Back on a report sent after the
  refusal (one that arrives at least a heartbeat interval later), so a report composed before the
  node heard of its own drain cannot put it back early, and one that never reports draining cannot
  be held forever.
- ``switching``: the gateway asked it to change role. Back when the node reports draining or its
  new role (then its own reports rule).
- ``drained``: an operator drained it (``prfaas drain``). Back only on ``resume``.
- ``draining``: its own report says it drains.

A request that merely failed at a node (a 500, an engine error for that request) is no reason to
leave rotation: the dispatcher fails or retries that request and the node keeps serving.
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.core import NodeRole

QUARANTINE_BASE_S = 0.5
QUARANTINE_MAX_S = 30.0


@dataclass
class Rotation:
    """One node's rotation state (mutable, owned by the registry)."""

    role: NodeRole
    silent: bool = False
    fault: str = ""
    drained: bool = False
    reported_draining: bool = False
    failure: str = ""
    """Why the gateway last failed to reach the node; empty once a heartbeat readmitted it."""
    num_strikes: int = 0
    """Failures since the node last completed a request: sizes the quarantine."""
    quarantine_until_s: float = 0.0
    refused_until_s: float | None = None
    switching_from: NodeRole | None = None
    """The role the node had when the gateway asked it to switch."""

    # -- events -----------------------------------------------------------------------------------
    def on_report(self, role: NodeRole, draining: bool, fault: str, now_s: float) -> None:
        """A heartbeat (or registration) report from the node itself."""
        self.silent = False
        self.fault = fault
        self.reported_draining = draining
        if self.failure and now_s >= self.quarantine_until_s:
            self.failure = ""
        if self.refused_until_s is not None and now_s >= self.refused_until_s:
            self.refused_until_s = None
        if self.switching_from is not None and (draining or role is not self.switching_from):
            self.switching_from = None
        self.role = role

    def on_silent(self) -> None:
        self.silent = True

    def on_unreachable(self, reason: str, now_s: float) -> None:
        if self.failure and now_s < self.quarantine_until_s:
            # Already out: the other requests that were in flight to it fail too, at once. They
            # are the same outage, not more strikes (40 of them took the quarantine to its 30 s
            # maximum at once, keeping a restarted node out long after it was back).
            self.failure = reason
            return
        self.num_strikes += 1
        quarantine_s = min(QUARANTINE_BASE_S * 2 ** (self.num_strikes - 1), QUARANTINE_MAX_S)
        self.failure = reason
        self.quarantine_until_s = now_s + quarantine_s

    def on_success(self) -> None:
        self.num_strikes = 0

    def on_refused(self, now_s: float, report_interval_s: float) -> None:
        self.refused_until_s = now_s + report_interval_s

    def on_switch(self) -> None:
        self.switching_from = self.role

    # -- state ------------------------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        """Able to serve at all (the view's ``healthy``)."""
        return not (self.silent or self.fault or self.failure)

    @property
    def held(self) -> bool:
        """Alive but taking no new work (the view's ``draining``)."""
        return (
            self.drained
            or self.reported_draining
            or self.refused_until_s is not None
            or self.switching_from is not None
        )

    def why_not(self) -> str:
        """Empty when in rotation; otherwise the first reason, for ``prfaas status``."""
        if self.silent:
            return "silent: no heartbeat within the timeout"
        if self.fault:
            return f"fault: {self.fault}"
        if self.failure:
            return f"unreachable ({self.num_strikes} since last success): {self.failure}"
        if self.drained:
            return "drained by an operator"
        if self.switching_from is not None:
            return f"switching role from {self.switching_from.value}"
        if self.reported_draining:
            return "draining"
        if self.refused_until_s is not None:
            return "refused work: held until its next report"
        return ""
