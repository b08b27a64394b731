"""Decode-side event handlers of the simulator: KV arrival, admission, continuous batching in
closed form (completion times from ``CostModel.decode_span_s`` between membership changes), and
request completion. A mixin of ``Simulator`` (split out to keep one concept per file). Pure.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from prfaas.sim import events as ev
from prfaas.sim.nodes import DecodeNode
from prfaas.sim.request import SimRequest

if TYPE_CHECKING:
    from prfaas.sim.simulator import Simulator


class DecodeDriver:
    """Mixin: its methods run with ``self`` a ``Simulator`` (mypy: explicit self types)."""

    def _on_kv_arrive(self: Simulator, req: SimRequest, _: Any) -> None:  # type: ignore[misc]
        now = self.now
        req.kv_ready_s = now
        dec: DecodeNode = req.decode_node  # type: ignore[assignment]
        dec.reserved -= 1
        dec.cached_load = None
        if not dec.waiting and self.admission[dec.site].admit_fast(
            len(dec.members), dec.kv_used, dec.kv_capacity, req.kv_bytes
        ):
            self._join(dec, req)
        else:
            dec.waiting.append(req)
            s = dec.site
            self.site_waiting[s] += 1
            if self.site_waiting[s] > self.peak_waiting[s]:
                self.peak_waiting[s] = self.site_waiting[s]

    # Decode bookkeeping without a per-member loop: the node counts steps since it started
    # (``dec.step``); a member joining at step j with context c finishes at step j + output and
    # has context c + (s - j) at step s, so the batch's total context at step s is
    # ``ctx_base + B * s`` with ``ctx_base = sum(c - j)``. Members sit in a heap by finish step.
    def _enter(self: Simulator, dec: DecodeNode, req: SimRequest, step: int, at_s: float) -> None:  # type: ignore[misc]
        req.decode_start_s = at_s
        req.remaining_steps = step + req.num_output  # the finish step
        req.context = req.num_prompt - step  # this member's share of ctx_base
        dec.ctx_sum += req.context
        dec.seq += 1
        heapq.heappush(dec.members, (req.remaining_steps, dec.seq, req))

    def _join(self: Simulator, dec: DecodeNode, req: SimRequest) -> None:  # type: ignore[misc]
        dec.kv_used += req.kv_bytes
        if not dec.members:
            self._enter(dec, req, dec.step, self.now)
            self._new_span(dec, self.now)
            return
        # Mid-span: the step in progress finishes without the newcomer; it joins at that step
        # boundary, where a new span (new batch size and context) begins. One event, not two.
        cm = dec.cm
        start = dec.span_start_s
        elapsed = self.now - start
        k = cm.decode_steps_within(dec.span_batch, dec.span_ctx, elapsed) + 1 if elapsed > 0 else 0
        if k > dec.tick_steps:
            k = dec.tick_steps  # the boundary is the pending tick itself
        boundary_s = start + cm.decode_span_s(dec.span_batch, dec.span_ctx, k)
        dec.busy_s += boundary_s - start
        dec.slot_s += (boundary_s - start) * dec.span_batch
        dec.step += k
        self._enter(dec, req, dec.step, boundary_s)
        self._new_span(dec, boundary_s)

    def _new_span(self: Simulator, dec: DecodeNode, start_s: float) -> None:  # type: ignore[misc]
        members = dec.members
        b = len(members)
        dec.span_start_s = start_s
        dec.span_batch = b
        dec.span_ctx = dec.ctx_sum + b * dec.step
        steps = members[0][0] - dec.step
        dec.tick_steps = steps
        dec.tick_s = start_s + dec.cm.decode_span_s(b, dec.span_ctx, steps)
        dec.tick_version += 1
        self.q.push(dec.tick_s, ev.DECODE_TICK, dec, dec.tick_version)

    def _on_decode_tick(self: Simulator, dec: DecodeNode, version: int) -> None:  # type: ignore[misc]
        if version != dec.tick_version:
            return
        now = self.now
        dec.busy_s += now - dec.span_start_s
        dec.slot_s += (now - dec.span_start_s) * dec.span_batch
        step = dec.step = dec.step + dec.tick_steps
        members = dec.members
        while members and members[0][0] <= step:
            req = heapq.heappop(members)[2]
            self._finish(req, dec)
        adm = self.admission[dec.site]
        waiting = dec.waiting
        while waiting and adm.admit_fast(
            len(members), dec.kv_used, dec.kv_capacity, waiting[0].kv_bytes
        ):
            req = waiting.popleft()
            self.site_waiting[dec.site] -= 1
            dec.kv_used += req.kv_bytes
            self._enter(dec, req, step, now)
        self.decode_pools[dec.site].touch(dec)  # type: ignore[union-attr]
        if members:
            self._new_span(dec, now)
        else:
            dec.tick_s = float("inf")
            dec.tick_steps = 0
            if dec.draining and dec.is_idle():
                self._drained(dec)

    def _finish(self: Simulator, req: SimRequest, dec: DecodeNode) -> None:  # type: ignore[misc]
        now = self.now
        req.finish_s = now
        if self.on_finish is not None:
            self.on_finish(req)
        dec.kv_used -= req.kv_bytes
        dec.ctx_sum -= req.context
        m = self.metrics
        m.num_completed += 1
        m.output_tokens += req.num_output
        if now > m.last_finish_s:
            m.last_finish_s = now
        if req.arrival_s < self.sc.warmup_s:
            return
        ttft = req.kv_ready_s - req.arrival_s
        tpot = (now - req.decode_start_s) / req.num_output
        m.num_counted += 1
        m.ttft_s.append(ttft)
        m.tpot_s.append(tpot)
        m.e2e_s.append(now - req.arrival_s)
        if tpot > m.max_tpot_s:
            m.max_tpot_s = tpot
        if ttft <= self.sc.slo_ttft_s and tpot <= self.sc.slo_tpot_s * (1 + 1e-9):
            m.num_good += 1
