"""``ControlLoop``: the gateway's periodic decisions, the same policy object the simulator runs.

Each ``tick`` expires silent nodes (the gateway calls it at least every 0.25 s of wall time, so a
dead node leaves rotation promptly); every ``control_interval_s`` of *modelled* time
(``control_interval_s * time_scale`` wall seconds with timed engines: the simulator's interval,
on a grid from the first tick, missed ones skipped rather than run in a burst) it also asks
``policy.ControlPolicy.tick`` (built by ``policy.control_policy``, as the simulator builds its
own) what to do: ``ThresholdTuner`` re-searches ``t`` when the link or the node counts changed (or
periodically) and, when enabled, ``Rebalancer`` converts PD nodes between prefill and decode
(Eq. 8 far off). This loop carries the actions out: a role change asks the node to drain, then
switch (``POST /nodes/{node}/role``); a threshold goes into the registry's view
(``set_threshold``, also how a pool tenant's ``pool.tenant_tuner.TenantTuner`` sets its ``t``).
Decisions are logged and exported as metrics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import httpx

from prfaas.core import NodeId, NodeRole, SiteId
from prfaas.perf import CostModel
from prfaas.policy import ControlPolicy, RoleChange, TuningConfig, control_policy
from prfaas.policy.decision_log import observe_record, tick_record
from prfaas.policy.window import LengthWindow
from prfaas.serve.gateway.decision_log import DecisionLog
from prfaas.serve.gateway.registry import NodeRegistry

log = logging.getLogger("prfaas.gateway")


@dataclass
class ControlLog:
    threshold_updates: list[dict[str, object]] = field(default_factory=list)
    role_changes: list[dict[str, object]] = field(default_factory=list)


class ControlLoop:
    def __init__(
        self,
        registry: NodeRegistry,
        remote: CostModel | None,
        local: CostModel | None,
        tune: bool,
        rebalance: bool,
        tuning: TuningConfig,
        interval_s: float = 1.0,
    ) -> None:
        """``interval_s``: modelled seconds between the policy's ticks."""
        if not interval_s > 0:
            raise ValueError(f"control interval must be > 0 s, got {interval_s}")
        self.registry = registry
        self.interval_s = interval_s
        self._due_s: float | None = None
        """Modelled time of the policy's next tick (set by the first call)."""
        d = registry.deployment
        self.home = SiteId(d.home_site.name)
        remote_sites = [SiteId(s.name) for s in d.sites if s.kind == "prfaas"]
        self.num_ticks = 0
        self.log = ControlLog()
        self.decisions: DecisionLog | None = None
        """Where each observation and tick is logged (``gateway.decision_log``)."""
        self.policy: ControlPolicy = control_policy(
            self.home, remote_sites, remote, local, tune=tune, rebalance=rebalance, config=tuning
        )

    @property
    def window(self) -> LengthWindow:
        """The policy's window of recent lengths (``/internal/control`` reports its size)."""
        return self.policy.window

    def observe(self, num_uncached_tokens: int, num_output_tokens: int) -> None:
        now = self.registry.modelled_s(time.monotonic())
        self.policy.observe(num_uncached_tokens, num_output_tokens, now)
        if self.decisions is not None:
            self.decisions.write(observe_record(num_uncached_tokens, num_output_tokens, now))

    def wait_s(self, now_wall_s: float) -> float:
        """Wall seconds from ``now_wall_s`` until the policy's next tick is due."""
        reg = self.registry
        now = reg.modelled_s(now_wall_s)
        if self._due_s is None:
            self._due_s = now + self.interval_s
        return max(0.0, (self._due_s - now) * reg.time_scale)

    def _policy_due(self, now: float) -> bool:
        if self._due_s is None:
            self._due_s = now + self.interval_s
        # A wake-up a hair early (float rounding of the wall sleep) still counts as on time.
        if now < self._due_s - 1e-6 * self.interval_s:
            return False
        self._due_s += self.interval_s
        if self._due_s <= now:  # late by more than an interval: skip, do not burst
            self._due_s = now + self.interval_s
        return True

    async def tick(self, client: httpx.AsyncClient) -> None:
        """Expire silent nodes; when the modelled interval is up, run the policy's tick."""
        reg = self.registry
        now_wall = time.monotonic()
        reg.expire(now_wall)
        now = reg.modelled_s(now_wall)
        if not self._policy_due(now):
            return
        self.num_ticks += 1
        actions = self.policy.tick(reg.view, now)
        if self.decisions is not None and self.policy.active:
            self.decisions.write(tick_record(reg.view, now, actions))
        for action in actions:
            if isinstance(action, RoleChange):
                await self._switch(client, action.node_id, action.dst_role)
            else:
                self.set_threshold(action.threshold_tokens, now, action.reason)

    def set_threshold(self, threshold_tokens: int, now: float, reason: str) -> None:
        """Route with ``t = threshold_tokens`` from now on (``now``: modelled s), logged: the one
        way the live ``t`` changes (this loop's tuner and rebalancer, a pool tenant's tuner)."""
        self.registry.view.set_threshold_tokens(threshold_tokens)
        entry = {"t_s": round(now, 3), "threshold_tokens": threshold_tokens, "reason": reason}
        self.log.threshold_updates.append(entry)
        log.warning("threshold -> %d tokens (%s)", threshold_tokens, reason)

    async def _switch(self, client: httpx.AsyncClient, node: NodeId, role: NodeRole) -> None:
        ep = self.registry.endpoints.get(node)
        if ep is None:
            return
        scheme = self.registry.deployment.control_scheme
        url = f"{scheme}://{ep.host}:{ep.http_port}/nodes/{node}/role"
        try:
            r = await client.post(url, json={"role": role.value}, timeout=5.0)
        except httpx.HTTPError as exc:
            log.warning("role change of %s failed: %s", node, exc)
            return
        if r.status_code == 200:
            self.registry.mark_switching(node)
            entry = {"t_s": round(self.registry.modelled_s(time.monotonic()), 3), "node": node,
                     "to": role.value}  # fmt: skip
            self.log.role_changes.append(entry)
            log.warning("node %s drains, then becomes %s", node, role.value)
