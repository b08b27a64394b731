"""``DecodeStage``: the simulator's decode nodes at work. A request whose KV arrived joins its
decode node's batch (at the next step boundary, if a slot and the KV memory allow; else it
waits), and completes; completion times are computed between batch membership changes
(``CostModel.decode_span_s``), so a request costs O(1) events whatever its output length.

A collaborator the ``Simulator`` owns: it handles KV_ARRIVE and DECODE_TICK, reads and changes
the ``World``, and reports a drained node through the callback it is given. Pure.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from prfaas.core.request import TRANSITIONS, InvalidTransition, RequestState
from prfaas.sim.events import DecodeTick, EventKind, Handoff, KvArrive
from prfaas.sim.nodes import DecodeNode, SimNode
from prfaas.sim.request import SimRequest
from prfaas.sim.world import World

_DECODE_TICK = EventKind.DECODE_TICK
_DECODING = RequestState.DECODING
_FINISHED = RequestState.FINISHED
# The states each move may start from (``TRANSITIONS`` inverted once: one set lookup per move).
_INTO_DECODING = frozenset(s for s, to in TRANSITIONS.items() if _DECODING in to)
_INTO_FINISHED = frozenset(s for s, to in TRANSITIONS.items() if _FINISHED in to)


class DecodeStage:
    def __init__(
        self, world: World, on_drained: Callable[[SimNode], None],
        on_cores_changed: Callable[[int, float, SimNode | None], None] | None = None,
    ) -> None:  # fmt: skip
        self._world = world
        self._on_drained = on_drained
        """Called when a draining node has finished its last request (role conversion)."""
        self._on_cores_changed = on_cores_changed
        """Called when a site's shared cores got busier or freer, after its decode nodes were
        re-spanned (the simulator re-times the site's prefills)."""
        # The world's containers are never replaced: held directly (fewer lookups per event).
        self._heap = world.q.heap
        self._seq = world.q.seq
        self._admission = world.admission
        self._metrics = world.metrics
        self._decode_pools = world.pools.decode
        self._shared = world.shared
        self._kv_bytes = world.kv_bytes
        self._local_kv_in_place = tuple(s.local_kv_in_place for s in world.sc.sites)

    def _install_s(self, dec: DecodeNode, req: SimRequest, book: bool = False) -> float:
        """The decode node's work to take ``req`` in (``sim.plumbing``): its fixed per-request
        cost and the KV bytes it received (over the link, or a local prefill's whole prompt
        where the site's prefill node is another engine: at one engine's site a local prefill's
        KV is where its decode runs, nothing to take in), verified and installed; on shared
        cores, slowed as its steps are. ``book``: the node does it now (``work_s`` counts it)."""
        nbytes = req.transfer_bytes
        if not nbytes:
            if self._local_kv_in_place[dec.site]:
                return 0.0
            nbytes = self._kv_bytes.total(req.num_prompt)
        work_s = dec.per_request_s + dec.install_per_byte_s * nbytes
        if book:
            dec.work_s += work_s
        shared = self._shared[dec.site]
        return work_s if shared is None else work_s * shared.slowdown()

    def on_kv_arrive(self, event: KvArrive | Handoff) -> None:
        """A KV_ARRIVE event, or the handoff itself when the KV needs no propagation delay
        (both end with the request and its decode node)."""
        w = self._world
        req = event[-2]
        dec = event[-1]
        if req.state not in _INTO_DECODING:  # core.request.advance, inline (hot path)
            raise InvalidTransition(f"r{req.index}", req.state, _DECODING)
        req.state = _DECODING
        req.kv_ready_s = w.now
        if dec.installs:
            # The first token goes out once the KV is installed (the install itself is
            # charged to the node's batch when the request joins it).
            req.kv_ready_s += self._install_s(dec, req)
        if dec.first_token_waits:
            # Its first token crosses the processes' hops, behind the tokens of the batch
            # decoding here (a latency: the relays' CPU is in the step's per-token terms).
            req.kv_ready_s += dec.first_token_wait_s + dec.first_token_wait_per_decoding_s * len(
                dec.members
            )
        dec.reserved -= 1
        dec.cached_load = None
        if not dec.waiting and self._admission[dec.site].admit_fast(
            len(dec.members), dec.kv_used, dec.kv_capacity, req.kv_bytes
        ):
            self._join(dec, req)
        else:
            dec.waiting.append(req)
            s = dec.site
            w.site_waiting[s] += 1
            if w.site_waiting[s] > w.peak_waiting[s]:
                w.peak_waiting[s] = w.site_waiting[s]

    # Decode bookkeeping without a per-member loop: the node counts steps since it started
    # (``dec.step``); a member joining at step j with context c finishes at step j + output and
    # has context c + (s - j) at step s, so the batch's total context at step s is
    # ``ctx_base + B * s`` with ``ctx_base = sum(c - j)``. Members sit in a heap by finish step.
    # An engine that pads its batch (``DecodeNode.pads_batch``) computes ``B`` rows of the
    # longest context, ``B * (max(c - j) + s)``: the max from a second heap.
    @staticmethod
    def _enter(dec: DecodeNode, req: SimRequest, step: int, at_s: float) -> None:
        req.decode_start_s = at_s
        # The finish step: the prefill sampled the first token, the node steps for the rest (a
        # one-token request finishes as it joins, as a live node relays its token and ends).
        req.remaining_steps = step + req.num_output - 1
        req.context = req.num_prompt - step  # this member's share of ctx_base
        dec.ctx_sum += req.context
        dec.seq += 1
        heapq.heappush(dec.members, (req.remaining_steps, dec.seq, req))
        if dec.pads_batch:
            tops = dec.ctx_tops
            if len(tops) > 4 * len(dec.members) + 64:  # finished members piled up below the top
                tops[:] = [t for t in tops if t[2].state is not _FINISHED]
                heapq.heapify(tops)
            heapq.heappush(tops, (-req.context, dec.seq, req))

    def _join(self, dec: DecodeNode, req: SimRequest) -> None:
        now = self._world.now
        dec.kv_used += req.kv_bytes
        if not dec.members:
            shared = self._shared[dec.site]
            if shared is not None:  # the node starts computing: its site's cores get busier
                shared.busy += 1
                self.respan_site(dec.site, now, dec)
            # Installing the KV (``sim.plumbing``) is the node's first work.
            start_s = now
            if dec.installs:
                install_s = self._install_s(dec, req, book=True)
                dec.busy_s += install_s
                start_s += install_s
            self._enter(dec, req, dec.step, start_s)
            self._new_span(dec, start_s)
            return
        # Mid-span: the step in progress finishes without the newcomer; it joins at that step
        # boundary, where a new span (new batch size and context) begins. One event, not two.
        # The batch pauses there while the node installs the newcomer's KV (``sim.plumbing``).
        boundary_s = self._step_boundary(dec, now)
        if dec.installs:
            install_s = self._install_s(dec, req, book=True)
            dec.busy_s += install_s
            dec.slot_s += install_s * dec.span_batch
            boundary_s += install_s
        self._enter(dec, req, dec.step, boundary_s)
        self._new_span(dec, boundary_s)

    def _step_boundary(self, dec: DecodeNode, now: float) -> float:
        """End the span at the boundary of the step in progress at ``now`` (its steps and busy
        time booked); returns that boundary, where the next span starts."""
        cm = dec.cm
        start = dec.span_start_s
        factor = dec.span_factor
        elapsed = (now - start) / factor
        k = cm.decode_steps_within(dec.span_batch, dec.span_ctx, elapsed) + 1 if elapsed > 0 else 0
        if k > dec.tick_steps:
            k = dec.tick_steps  # the boundary is the pending tick itself
        own_s = cm.decode_span_s(dec.span_batch, dec.span_ctx, k)
        boundary_s = start + own_s * factor
        dec.busy_s += boundary_s - start
        dec.work_s += own_s
        dec.slot_s += (boundary_s - start) * dec.span_batch
        dec.step += k
        return boundary_s

    def respan_site(self, site: int, now: float, changed: SimNode | None = None) -> None:
        """The site's shared cores got busier or freer at ``now``: every other decode node of
        the site continues from its next step boundary at the new speed, and (``on_cores_changed``)
        every other prefill computing there from now."""
        for dec in self._world.decode_nodes_of(site):
            if dec is changed or not dec.members:
                continue
            if now <= dec.span_start_s:  # the span begins at a boundary still ahead
                self._new_span(dec, dec.span_start_s)
            else:
                self._new_span(dec, self._step_boundary(dec, now))
        if self._on_cores_changed is not None:
            self._on_cores_changed(site, now, changed)

    def _new_span(self, dec: DecodeNode, start_s: float) -> None:
        members = dec.members
        b = len(members)
        dec.span_start_s = start_s
        dec.span_batch = b
        if dec.pads_batch:
            # Every row padded to the longest member's context (all grow one token a step, so
            # the longest stays the longest until the membership changes).
            tops = dec.ctx_tops
            while tops[0][2].state is _FINISHED:
                heapq.heappop(tops)
            dec.span_ctx = b * (dec.step - tops[0][0])
        else:
            dec.span_ctx = dec.ctx_sum + b * dec.step
        steps = members[0][0] - dec.step
        dec.tick_steps = steps
        shared = self._shared[dec.site]
        span_s = dec.cm.decode_span_s(b, dec.span_ctx, steps)
        if shared is None:
            factor = 1.0
        elif shared.mixed_steps and steps > 0:
            factor = shared.decode_slowdown(span_s / steps, dec.cm.decode_step_fixed_s())
        else:
            factor = shared.slowdown()
        dec.span_factor = factor
        dec.tick_s = start_s + span_s * factor
        dec.tick_version += 1
        heapq.heappush(
            self._heap, (dec.tick_s, _DECODE_TICK, next(self._seq), dec, dec.tick_version)
        )

    def on_tick(self, tick: DecodeTick) -> None:
        _, _, _, dec, version = tick
        if version != dec.tick_version:
            return
        w = self._world
        now = w.now
        dec.busy_s += now - dec.span_start_s
        dec.work_s += (now - dec.span_start_s) / dec.span_factor
        dec.slot_s += (now - dec.span_start_s) * dec.span_batch
        step = dec.step = dec.step + dec.tick_steps
        members = dec.members
        while members and members[0][0] <= step:
            req = heapq.heappop(members)[2]
            self._finish(req, dec)
        adm = self._admission[dec.site]
        waiting = dec.waiting
        start_s = now
        if waiting:
            installs = dec.installs
            while waiting and adm.admit_fast(
                len(members), dec.kv_used, dec.kv_capacity, waiting[0].kv_bytes
            ):
                req = waiting.popleft()
                w.site_waiting[dec.site] -= 1
                dec.kv_used += req.kv_bytes
                if installs:  # each admitted request's KV is installed before the next span
                    start_s += self._install_s(dec, req, book=True)
                self._enter(dec, req, step, start_s)
        self._decode_pools[dec.site].touch(dec)
        if members:
            if start_s > now:
                dec.busy_s += start_s - now
            self._new_span(dec, start_s)
        else:
            dec.tick_s = float("inf")
            dec.tick_steps = 0
            shared = self._shared[dec.site]
            if shared is not None:  # the node stops computing: its site's cores get freer
                shared.busy -= 1
                self.respan_site(dec.site, now, dec)
            if dec.draining and dec.is_idle():
                self._on_drained(dec)

    def _finish(self, req: SimRequest, dec: DecodeNode) -> None:
        w = self._world
        now = w.now
        if req.state not in _INTO_FINISHED:
            raise InvalidTransition(f"r{req.index}", req.state, _FINISHED)
        req.state = _FINISHED
        req.finish_s = now
        if w.on_finish is not None:
            w.on_finish(req)
        dec.kv_used -= req.kv_bytes
        dec.ctx_sum -= req.context
        m = self._metrics
        m.num_completed += 1
        m.output_tokens += req.num_output
        m.prompt_tokens += req.num_prompt
        if now > m.last_finish_s:
            m.last_finish_s = now
        sc = w.sc
        if req.arrival_s < sc.warmup_s:
            return
        ttft = req.kv_ready_s - req.arrival_s
        # Time per output token after the first (which the prefill sampled); a one-token
        # request has none (0: it meets any TPOT SLO, and no TPOT figure counts it).
        tpot = (now - req.decode_start_s) / (req.num_output - 1) if req.num_output > 1 else 0.0
        m.num_counted += 1
        m.ttft_s.append(ttft)
        if req.num_output > 1:
            m.tpot_s.append(tpot)
        m.e2e_s.append(now - req.arrival_s)
        if tpot > m.max_tpot_s:
            m.max_tpot_s = tpot
        if ttft <= sc.slo_ttft_s and tpot <= sc.slo_tpot_s * (1 + 1e-9):
            m.num_good += 1
