"""A simulated inter-site link: fluid flows sharing a capacity max-min fairly.

Each transfer is a flow of ``num_bytes``. Its rate is capped by its TCP windows
(``connections x window_bytes / rtt``, as measured in MEASURED.md: RTT limits throughput, not only
latency) and, while its prefill is still running, by the rate at which layer-wise prefill produces
KV (all but the last layer's share over the prefill time): so a transfer starts with the first
layer and ends no earlier than prefill end plus the last layer's share. When the caps of all flows
fit the capacity each flow runs at its cap and flows are independent (O(1) per change); otherwise
rates are recomputed by water-filling (O(F log F)). The capacity may change over time (a schedule
of ``(time_s, gbps)`` steps). Delivery adds half an RTT of propagation. ``state`` is the link's
``LinkState``: ``congested`` is ``core.CongestionRule`` over its utilisation (goodput averaged by
``core.link_estimate.DeliveredRate``, as the gateway's) and drain. Pure.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

from prfaas.core.congestion import CongestionRule
from prfaas.core.ids import LinkId
from prfaas.core.link_estimate import DeliveredRate
from prfaas.core.views import LinkState, new_link_state


class Flow:
    __slots__ = ("cap", "done_s", "finished", "key", "last_s", "link", "num_bytes", "payload",
                 "rate", "remaining", "version")  # fmt: skip

    def __init__(self, link: SimLink, num_bytes: float, cap: float, payload: object) -> None:
        self.link = link
        self.num_bytes = num_bytes
        self.remaining = num_bytes
        self.cap = cap
        self.rate = 0.0
        self.last_s = 0.0
        self.version = 0
        self.finished = False
        self.key = 0
        self.done_s = float("inf")
        self.payload = payload


_by_cap = operator.attrgetter("cap")
_DEFAULT_CONGESTION = CongestionRule()


class SimLink:
    def __init__(
        self,
        link_id: LinkId,
        capacity_bytes_per_s: float,
        rtt_s: float,
        connections: int,
        window_bytes: float,
        schedule_done: Callable[[float, Flow, int], None],
        congestion: CongestionRule = _DEFAULT_CONGESTION,
    ) -> None:
        self.link_id = link_id
        self.capacity = capacity_bytes_per_s
        self.nominal_capacity = capacity_bytes_per_s
        self.rtt_s = rtt_s
        self.window_cap = connections * window_bytes / rtt_s if rtt_s > 0 else float("inf")
        self._schedule_done = schedule_done
        """``(time_s, flow, flow.version)``: schedules the flow's completion event (the driver
        calls ``finish`` then if the flow still has that version)."""
        self._flows: dict[int, Flow] = {}
        self._next_id = 0
        self.sum_caps = 0.0
        self._oversubscribed = False
        """The flows' caps exceed the capacity: rates are water-filled (not ``congested``, which
        is the ``CongestionRule`` verdict in ``state``)."""
        # backlog(now) = _agg_a - _agg_r * now (sum over flows of remaining at now).
        self._agg_a = 0.0
        self._agg_r = 0.0
        self.bytes_added = 0.0
        self.peak_backlog_bytes = 0.0
        self.num_flows_done = 0
        self.congestion = congestion
        self._goodput = DeliveredRate()
        self.version = 0
        """Bumped on every rate change (a cached ``LinkState`` is valid while it holds)."""
        self._state: LinkState | None = None
        self._state_version = -1

    # -- flows ---------------------------------------------------------------------------------
    def add(self, now: float, num_bytes: float, produce_s: float, payload: object,
            num_layers: int) -> Flow:  # fmt: skip
        cap = self.window_cap
        if produce_s > 0 and num_layers > 1:
            cap = min(cap, num_bytes * (1.0 - 1.0 / num_layers) / produce_s)
        flow = Flow(self, num_bytes, cap, payload)
        flow.last_s = now
        self._next_id += 1
        flow.key = self._next_id
        self._flows[flow.key] = flow
        self.sum_caps += cap
        self._agg_a += num_bytes
        self.bytes_added += num_bytes
        self.version += 1
        self._reshape(now, flow)
        b = self.backlog_bytes(now)
        if b > self.peak_backlog_bytes:
            self.peak_backlog_bytes = b
        return flow

    def produced(self, flow: Flow, now: float) -> None:
        """The flow's prefill ended: the rest of its KV (last layer included) may go."""
        if flow.finished or flow.cap == self.window_cap:
            return
        self.sum_caps += self.window_cap - flow.cap
        flow.cap = self.window_cap
        self._reshape(now, flow)

    def finish(self, flow: Flow, now: float) -> None:
        """Called by the driver when ``flow``'s done event fires (and is current)."""
        self._advance(flow, now)
        self._agg_a -= flow.remaining  # numerical remainder
        flow.remaining = 0.0
        flow.finished = True
        self._set_rate(flow, 0.0, now)
        del self._flows[flow.key]
        self.sum_caps -= flow.cap
        self.num_flows_done += 1
        if self._oversubscribed or self.sum_caps > self.capacity:
            self._waterfill(now)

    def set_capacity(self, now: float, capacity_bytes_per_s: float) -> None:
        self.capacity = capacity_bytes_per_s
        self.version += 1
        self._waterfill(now)

    # -- rates ---------------------------------------------------------------------------------
    def _advance(self, flow: Flow, now: float) -> None:
        dt = now - flow.last_s
        if dt > 0 and flow.rate > 0:
            flow.remaining -= flow.rate * dt
        flow.last_s = now

    def _set_rate(self, flow: Flow, rate: float, now: float) -> None:
        self.version += 1
        # Keep the backlog aggregate exact: remove the old linear term, add the new one.
        self._agg_a -= flow.rate * flow.last_s
        self._agg_r -= flow.rate
        flow.rate = rate
        self._agg_a += rate * now
        self._agg_r += rate
        flow.version += 1
        if flow.finished:
            flow.done_s = float("inf")
        elif flow.remaining <= 1.0:
            # Done up to rounding (several flows can end at the same instant): finish now.
            flow.done_s = now
            self._schedule_done(now, flow, flow.version)
        elif rate > 0:
            flow.done_s = now + flow.remaining / rate
            self._schedule_done(flow.done_s, flow, flow.version)
        else:
            flow.done_s = float("inf")

    def _reshape(self, now: float, changed: Flow) -> None:
        if not self._oversubscribed and self.sum_caps <= self.capacity:
            self._advance(changed, now)
            self._set_rate(changed, changed.cap, now)
        else:
            self._waterfill(now)

    def _waterfill(self, now: float) -> None:
        # Max-min fair: in increasing order of cap, each flow gets min(cap, equal share of what is
        # left). Only flows whose rate changes are advanced and rescheduled: an unchanged flow's
        # (remaining, last_s, rate) still describe it exactly.
        flows = sorted(self._flows.values(), key=_by_cap)
        self._oversubscribed = self.sum_caps > self.capacity
        left = self.capacity
        n = len(flows)
        inf = float("inf")
        for i, f in enumerate(flows):
            share = left / (n - i)
            rate = f.cap if f.cap <= share else share
            left -= rate
            if rate != f.rate or f.done_s == inf:
                dt = now - f.last_s
                if dt > 0 and f.rate > 0:
                    f.remaining -= f.rate * dt
                f.last_s = now
                self._set_rate(f, rate, now)

    # -- observation ---------------------------------------------------------------------------
    def backlog_bytes(self, now: float) -> float:
        # Recompute from the aggregate: sum over flows of (remaining_at_last - rate*(now-last)).
        return max(0.0, self._agg_a - self._agg_r * now)

    def bytes_delivered(self, now: float) -> float:
        return self.bytes_added - self.backlog_bytes(now)

    @property
    def num_flows(self) -> int:
        return len(self._flows)

    def state(self, now: float) -> LinkState:
        cached = self._state
        if (
            cached is not None
            and cached.sampled_at_s == now
            and self._state_version == self.version
        ):
            return cached
        backlog = self.backlog_bytes(now)
        # Goodput: the delivered-bytes average the gateway's registry keeps too (one filter).
        goodput = self._goodput.observe(now, self.bytes_added - backlog)
        util = goodput / self.capacity if self.capacity > 0 else 1.0
        # The one congestion rule, with what the fluid model measures (no loss, no queue beyond
        # the backlog); a link with no capacity never drains.
        drain_s = backlog / self.capacity if self.capacity > 0 else math.inf
        congested = self.congestion.congested(util, drain_s)
        self._state = new_link_state(
            self.link_id, self.capacity, util, goodput, int(backlog), self.rtt_s, 0.0, congested,
            now, "configured",
        )  # fmt: skip
        self._state_version = self.version
        return self._state
