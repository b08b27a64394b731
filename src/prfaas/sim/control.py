"""Control and observation handlers of the simulator: role conversion (rebalancer plans drained
and applied), the periodic control tick (threshold re-search, rebalancing), time-series samples
and probes. A mixin of ``Simulator`` (split out to keep one concept per file). Pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prfaas.core.topology import NodeRole, SiteKind
from prfaas.policy import DecodeAdmission
from prfaas.sim import events as ev
from prfaas.sim.nodes import DecodeNode, PoolIndex, PrefillNode, SimNode

if TYPE_CHECKING:
    from prfaas.sim.simulator import Simulator

_PREFILL = NodeRole.PREFILL
_DECODE = NodeRole.DECODE


class ControlDriver:
    """Mixin: its methods run with ``self`` a ``Simulator`` (mypy: explicit self types)."""

    def _drain(self: Simulator, node: SimNode) -> None:  # type: ignore[misc]
        node.draining = True
        node.cached_load = None
        if node.is_idle():  # type: ignore[attr-defined]
            self._drained(node)

    def _drained(self: Simulator, node: SimNode) -> None:  # type: ignore[misc]
        self.pools[(node.site, node.role)].remove(node)
        self.q.push(self.now + self.sc.role_switch_s, ev.CONVERT, node)

    def _on_convert(self: Simulator, node: SimNode, _: Any) -> None:  # type: ignore[misc]
        site = node.site
        cm = node.cm
        new: SimNode
        if node.role is _PREFILL:
            kv_cap = int(cm.hardware.instance_memory_bytes * self.sc.decode_kv_fraction)
            if site not in self.admission:
                self.admission[site] = DecodeAdmission(cm.max_decode_batch)
                self.pools[(site, _DECODE)] = PoolIndex()
            new = DecodeNode(node.node_id, node.index, site, node.site_id, cm,
                             self.admission[site].max_batch, kv_cap)  # fmt: skip
        else:
            new = PrefillNode(node.node_id, node.index, site, node.site_id, cm)
            new.free_at_s = self.now
        new.busy_s = 0.0
        self.nodes[node.index] = new
        self.node_by_id[node.node_id] = new
        self.pools[(site, new.role)].add(new)
        self.metrics.role_changes.append(
            {"t_s": round(self.now, 6), "node": node.node_id, "to": new.role.value}
        )

    def _on_control(self: Simulator, _a: Any, _b: Any) -> None:  # type: ignore[misc]
        now = self.now
        m = self.metrics
        for h in self.homes:
            view = self.views[h]
            reb = self.rebalancers.get(h)
            if reb is not None:
                plan = reb.plan(view, now, self.windows[h])
                if plan is not None:
                    for change in plan.changes:
                        self._drain(self.node_by_id[change.node_id])
                    view.set_threshold_tokens(plan.threshold_tokens)
                    m.threshold_updates.append(
                        {"t_s": round(now, 6), "site": self.site_ids[h],
                         "threshold_tokens": plan.threshold_tokens, "reason": plan.reason}
                    )  # fmt: skip
                    continue
            tuner = self.tuners.get(h)
            if tuner is not None:
                upd = tuner.maybe_retune(view, now, self.windows[h])
                if upd is not None:
                    view.set_threshold_tokens(upd.threshold_tokens)
                    m.threshold_updates.append(
                        {"t_s": round(now, 6), "site": self.site_ids[h],
                         "threshold_tokens": upd.threshold_tokens, "reason": upd.reason}
                    )  # fmt: skip
        if now < self.sc.duration_s + self.sc.drain_s and not self._idle_for_good():
            self.q.push(now + self.sc.control_interval_s, ev.CONTROL)

    def _idle_for_good(self: Simulator) -> bool:  # type: ignore[misc]
        """No arrival to come and nothing in flight: periodic events may stop."""
        m = self.metrics
        return self.arrivals_done and m.num_arrived == m.num_completed + m.num_failed

    # -- observation ------------------------------------------------------------------------------
    def _on_sample(self: Simulator, _a: Any, _b: Any) -> None:  # type: ignore[misc]
        now = self.now
        m = self.metrics
        dt = self.sc.sample_interval_s
        m.samples_t.append(round(now, 6))
        for key, link in self.links.items():
            delivered = link.bytes_delivered(now)
            rate = (delivered - self._last_bytes[key]) / dt if now > 0 else 0.0
            self._last_bytes[key] = delivered
            lid = link.link_id
            cap = link.nominal_capacity
            m.sample(f"link_util:{lid}", rate / cap if cap > 0 else 0.0)
            m.sample(f"link_backlog_bytes:{lid}", link.backlog_bytes(now))
        for i, sid in enumerate(self.site_ids):
            m.sample(f"prefill_queue:{sid}", self.site_queued[i])
            if self.site_kinds[i] is SiteKind.PD:
                m.sample(f"decode_waiting:{sid}", self.site_waiting[i])
        if now < self.sc.duration_s and not self.stop and not self._idle_for_good():
            self.q.push(now + dt, ev.SAMPLE)

    def _on_probe(self: Simulator, _a: Any, _b: Any) -> None:  # type: ignore[misc]
        if self.probe is not None:
            self.probe(self)
