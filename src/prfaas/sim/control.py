"""``ControlLoop``: the simulator's control and observation. Role conversion (a role change
drains a node, which comes back in the other role after ``role_switch_s``), the periodic control
tick (each home site's ``policy.ControlPolicy``: threshold re-search, rebalancing, returned as
actions this loop carries out) and time-series samples.

A collaborator the ``Simulator`` owns: it handles CONVERT, CONTROL and SAMPLE, and its
``drained`` is what the prefill and decode stages call when a draining node empties. Pure.
"""

from __future__ import annotations

from prfaas.core.topology import SiteKind
from prfaas.policy import DecodeAdmission, RoleChange
from prfaas.sim.events import Convert, EventKind, Timer
from prfaas.sim.homes import HomeSite
from prfaas.sim.nodes import DecodeNode, PrefillNode, SimNode
from prfaas.sim.world import World


class ControlLoop:
    def __init__(self, world: World, homes: dict[int, HomeSite]) -> None:
        self._world = world
        self._homes = homes
        self._last_bytes = {k: 0.0 for k in world.links}
        """Bytes each link had delivered at the previous sample."""
        if any(h.control.active for h in homes.values()):
            world.q.timer(world.sc.control_interval_s, EventKind.CONTROL)
        if world.sc.timeseries:
            world.q.timer(0.0, EventKind.SAMPLE)

    # -- role conversion --------------------------------------------------------------------------
    def drain(self, node: SimNode) -> None:
        node.draining = True
        node.cached_load = None
        if node.is_idle():
            self.drained(node)

    def drained(self, node: SimNode) -> None:
        w = self._world
        w.pools.remove(node)
        q = w.q
        q.push((w.now + w.sc.role_switch_s, EventKind.CONVERT, q.next_seq(), node))

    def on_convert(self, event: Convert) -> None:
        w = self._world
        node = event[3]
        site = node.site
        cm = node.cm
        new: SimNode
        if isinstance(node, PrefillNode):
            adm = w.admission.get(site)
            if adm is None:
                bs = w.sc.sites[site].decode_max_batch or cm.max_decode_batch
                adm = w.admission[site] = DecodeAdmission(bs)
            new = DecodeNode(node.node_id, node.index, site, node.site_id, cm,
                             adm.max_batch, w.decode_kv_capacity(cm),
                             w.sc.sites[site].decode_pads_batch)  # fmt: skip
        else:
            new = PrefillNode(node.node_id, node.index, site, node.site_id, cm)
            new.free_at_s = w.now
        new.busy_s = 0.0
        w.add_node(new)
        w.metrics.role_changes.append(
            {"t_s": round(w.now, 6), "node": node.node_id, "to": new.role.value}
        )

    # -- the control tick -------------------------------------------------------------------------
    def on_control(self, _: Timer) -> None:
        """Each home site's ``ControlPolicy.tick`` (the gateway's too), its actions carried out:
        a role change drains the node (it converts once empty), a threshold is set."""
        w = self._world
        now = w.now
        m = w.metrics
        for h, home in self._homes.items():
            for action in home.control.tick(home.view, now):
                if isinstance(action, RoleChange):
                    self.drain(w.node_by_id[action.node_id])
                    continue
                home.view.set_threshold_tokens(action.threshold_tokens)
                m.threshold_updates.append(
                    {"t_s": round(now, 6), "site": w.site_ids[h],
                     "threshold_tokens": action.threshold_tokens, "reason": action.reason}
                )  # fmt: skip
        sc = w.sc
        if now < sc.duration_s + sc.drain_s and not w.idle_for_good():
            w.q.timer(now + sc.control_interval_s, EventKind.CONTROL)

    # -- observation ------------------------------------------------------------------------------
    def on_sample(self, _: Timer) -> None:
        w = self._world
        now = w.now
        m = w.metrics
        dt = w.sc.sample_interval_s
        m.samples_t.append(round(now, 6))
        for key, link in w.links.items():
            delivered = link.bytes_delivered(now)
            rate = (delivered - self._last_bytes[key]) / dt if now > 0 else 0.0
            self._last_bytes[key] = delivered
            lid = link.link_id
            cap = link.nominal_capacity
            m.sample(f"link_util:{lid}", rate / cap if cap > 0 else 0.0)
            m.sample(f"link_backlog_bytes:{lid}", link.backlog_bytes(now))
        for i, sid in enumerate(w.site_ids):
            m.sample(f"prefill_queue:{sid}", w.site_queued[i])
            if w.site_kinds[i] is SiteKind.PD:
                m.sample(f"decode_waiting:{sid}", w.site_waiting[i])
        if now < w.sc.duration_s and not w.stop and not w.idle_for_good():
            w.q.timer(now + dt, EventKind.SAMPLE)
