"""``AutoscaleBoard``: what the elastic pool's loop decided, as the gateway shows it.

The loop (``serve.elastic.loop.ElasticLoop``, in the ``prfaas up`` process) posts every decision
to the gateway's control listener (``POST /internal/autoscale``, signed); the board keeps the last
one per group (``GET /internal/autoscale``, ``prfaas status``) and exports, on the gateway's
``/metrics``:

- ``prfaas_autoscale_desired_nodes{group}``: the size the autoscaler wants (serving + starting),
  what KEDA (or any external scaler) reads to size a Kubernetes deployment;
- ``prfaas_autoscale_decisions_total{group,action,reason}``: every decision, ``reason`` the
  bounded code (``policy.autoscaler.REASON_CODES``), never the free text (it names loads);
- ``prfaas_autoscale_preemptions_total{group}``: spot notices the loop gave (a replayed trace or
  ``mttp_s``): every report carries the loop's running count per spot group, and the counter
  rises by what is new (a restarted loop, counting from 0 again, adds from there).

No I/O of its own; the loop's clock is not the gateway's, so a decision carries wall time
(``at_unix_s``) for people to read.
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field

from prfaas.policy.autoscaler import REASON_CODES
from prfaas.serve.api.metrics import GatewayMetrics


class AutoscaleReport(BaseModel):
    """One decision of the autoscaler, as the loop posts it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: str = Field(min_length=1, max_length=64)
    action: Literal["add", "drain", "hold"]
    num_nodes: int = Field(ge=0)
    desired_nodes: int = Field(ge=0)
    reason: str = Field(max_length=500)
    code: str
    at_unix_s: float
    num_serving: int = Field(0, ge=0)
    num_starting: int = Field(0, ge=0)
    num_draining: int = Field(0, ge=0)
    preemptions: dict[str, int] = Field(default_factory=dict, max_length=64)
    """Per spot group, the notices the loop has given since it started."""


class AutoscaleBoard:
    def __init__(self, metrics: GatewayMetrics) -> None:
        r = metrics.registry
        self.desired = Gauge(
            "autoscale_desired_nodes",
            "Nodes the autoscaler wants in a PrfaaS group (serving + starting): KEDA's target",
            ["group"], namespace="prfaas", registry=r,
        )  # fmt: skip
        self.decisions = Counter(
            "autoscale_decisions", "Autoscaler decisions by group, action and reason code",
            ["group", "action", "reason"], namespace="prfaas", registry=r,
        )  # fmt: skip
        self.preemptions = Counter(
            "autoscale_preemptions", "Spot notices given to a group's nodes (trace or mttp_s)",
            ["group"], namespace="prfaas", registry=r,
        )  # fmt: skip
        self._preempted: dict[str, int] = {}
        """Per group, the loop's count as last reported."""
        self.last: dict[str, AutoscaleReport] = {}
        """Per group, its last decision."""
        self.last_change: dict[str, AutoscaleReport] = {}
        """Per group, its last add or drain."""

    def record(self, report: AutoscaleReport) -> None:
        if report.code not in REASON_CODES:
            raise ValueError(f"code: {report.code!r} is none of {', '.join(REASON_CODES)}")
        self.last[report.group] = report
        if report.action != "hold":
            self.last_change[report.group] = report
        self.desired.labels(group=report.group).set(report.desired_nodes)
        self.decisions.labels(group=report.group, action=report.action, reason=report.code).inc()
        for group, count in report.preemptions.items():
            new = count - self._preempted.get(group, 0)
            if new < 0:  # the loop restarted: its count began again at 0
                new = count
            if new > 0:
                self.preemptions.labels(group=group).inc(new)
            self._preempted[group] = count

    def preempted(self, group: str) -> int:
        """The group's notices as the loop last reported them (``prfaas status``)."""
        return self._preempted.get(group, 0)

    def rows(self) -> list[dict[str, object]]:
        """Per group: its last decision and its last add or drain (None before any)."""
        out: list[dict[str, object]] = []
        for group, last in sorted(self.last.items()):
            change = self.last_change.get(group)
            out.append({**last.model_dump(), "last_change": change and change.model_dump(),
                        "preempted": self.preempted(group)})  # fmt: skip
        return out
