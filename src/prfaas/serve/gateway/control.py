"""``ControlLoop``: the gateway's periodic decisions, the same policy objects the simulator runs.

Every ``control_interval_s`` (modelled seconds) it expires silent nodes, lets ``ThresholdTuner``
re-search ``t`` when the link or the node counts changed (or periodically), and, when enabled, lets
``Rebalancer`` convert PD nodes between prefill and decode (Eq. 8 far off): the node drains, then
switches (``POST /nodes/{node}/role``). Decisions are logged and exported as metrics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import httpx

from prfaas.core import NodeId, NodeRole, SiteId
from prfaas.perf import CostModel
from prfaas.policy import LengthWindow, Rebalancer, ThresholdTuner, TuningConfig
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
    ) -> None:
        self.registry = registry
        d = registry.deployment
        self.home = SiteId(d.home_site.name)
        remote_sites = [SiteId(s.name) for s in d.sites if s.kind == "prfaas"]
        self.window = LengthWindow()
        self.num_ticks = 0
        self.log = ControlLog()
        self.tuner = (
            ThresholdTuner(self.home, remote_sites, remote, local, tuning)
            if tune and local is not None and remote_sites
            else None
        )
        self.rebalancer = (
            Rebalancer(self.home, remote_sites, remote, local, tuning)
            if rebalance and local is not None
            else None
        )

    def observe(self, num_uncached_tokens: int, num_output_tokens: int) -> None:
        now = self.registry.modelled_s(time.monotonic())
        self.window.observe(num_uncached_tokens, num_output_tokens, now)

    async def tick(self, client: httpx.AsyncClient) -> None:
        self.num_ticks += 1
        reg = self.registry
        now_wall = time.monotonic()
        reg.expire(now_wall)
        now = reg.modelled_s(now_wall)
        view = reg.view
        if self.rebalancer is not None:
            plan = self.rebalancer.plan(view, now, self.window)
            if plan is not None:
                for change in plan.changes:
                    await self._switch(client, change.node_id, change.dst_role)
                self._set_threshold(plan.threshold_tokens, now, plan.reason)
                return
        if self.tuner is not None:
            update = self.tuner.maybe_retune(view, now, self.window)
            if update is not None:
                self._set_threshold(update.threshold_tokens, now, update.reason)

    def _set_threshold(self, threshold_tokens: int, now: float, reason: str) -> None:
        self.registry.view.set_threshold_tokens(threshold_tokens)
        entry = {"t_s": round(now, 3), "threshold_tokens": threshold_tokens, "reason": reason}
        self.log.threshold_updates.append(entry)
        log.warning("threshold -> %d tokens (%s)", threshold_tokens, reason)

    async def _switch(self, client: httpx.AsyncClient, node: NodeId, role: NodeRole) -> None:
        ep = self.registry.endpoints.get(node)
        if ep is None:
            return
        url = f"http://{ep.host}:{ep.http_port}/nodes/{node}/role"
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
