"""``NoticeDesk``: a node process's side of a spot notice. It keeps, for the prefills its nodes
hold, what each is (uncached tokens, KV bytes to send, when it arrived, when it began computing)
and how long such a prefill takes here (the cost model's prefill and the paced KV stream, scaled
by what this node's finished prefills measured); on a notice it asks ``policy.plan_notice`` which
of them end by the deadline (kept) and which to hand back, and counts both.

The node API (``serve/node/app.py``) carries the plan out: every node of the process stops taking
prefills, the handed-back ones are cancelled and answered ``handed_back`` (the gateway serves them
on another node; a pool's front door queues them again); a SIGTERM notice ends the process once
the kept ones are done or at the deadline. Until a handed-back prefill has ended the desk says so
(``was_handed_back``): the node then aborts its KV session as handed back, not cancelled, where
its command allows (``serve/node/worker.py``). No I/O here; the clock is passed in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from prfaas.policy.notice import HeldPrefill, NoticePlan, plan_notice

log = logging.getLogger("prfaas.node")
MEASURED_WEIGHT = 0.3
"""Weight of the latest finished prefill in the measured/estimated ratio (an EWMA)."""
MARGIN_FRACTION = 0.1
MIN_MARGIN_S = 0.2
"""A prefill is kept only if expected to end this much before the deadline (a tenth of the
notice, at least 0.2 s): one kept that does not end is handed back at the deadline, later than
had it been handed back at once."""


@dataclass
class _Held:
    num_tokens: int
    kv_bytes: int
    arrived_s: float
    started_s: float | None = None


class NoticeDesk:
    def __init__(self, estimate_s: Callable[[int, int], float]) -> None:
        """``estimate_s(num_uncached_tokens, kv_payload_bytes)``: wall seconds of one prefill and
        its KV stream here, before anything was measured."""
        self.estimate_s = estimate_s
        self.ratio = 1.0
        """Measured over estimated wall seconds of this node's finished prefills (EWMA)."""
        self.s_per_token: float | None = None
        """Measured wall seconds per uncached token (EWMA): the estimate where none is priced
        (a real engine on a hardware preset: no cost model)."""
        self._held: dict[str, _Held] = {}
        self.deadline_s: float | None = None
        """Set by the first notice (a later, earlier one moves it)."""
        self.num_finished = 0
        """Prefills kept on a notice that then ended well."""
        self.num_handed_back = 0
        self._returned: set[str] = set()
        """Handed back and not yet ended: the node aborts their KV sessions as handed back."""

    # -- the node's hooks --------------------------------------------------------------------------
    def arrived(self, request_id: str, num_tokens: int, kv_bytes: int, now_s: float) -> None:
        self._held[request_id] = _Held(num_tokens, kv_bytes, now_s)

    def started(self, request_id: str, now_s: float) -> None:
        held = self._held.get(request_id)
        if held is not None and held.started_s is None:
            held.started_s = now_s

    def ended(self, request_id: str, ok: bool, now_s: float) -> None:
        self._returned.discard(request_id)
        held = self._held.pop(request_id, None)
        if held is None or not ok:
            return
        if self.deadline_s is not None:
            self.num_finished += 1
        if held.started_s is None:
            return
        took_s = now_s - held.started_s
        per_token = took_s / max(1, held.num_tokens)
        s = self.s_per_token
        self.s_per_token = per_token if s is None else s + MEASURED_WEIGHT * (per_token - s)
        estimate = self.estimate_s(held.num_tokens, held.kv_bytes)
        if estimate > 0:
            self.ratio += MEASURED_WEIGHT * (took_s / estimate - self.ratio)

    def expected_s(self, num_tokens: int, kv_bytes: int) -> float:
        """This node's expectation of one prefill and its KV stream, alone."""
        estimate = self.estimate_s(num_tokens, kv_bytes)
        if estimate > 0:
            return self.ratio * estimate
        return (self.s_per_token or 0.0) * num_tokens

    # -- the notice --------------------------------------------------------------------------------
    @property
    def num_held(self) -> int:
        return len(self._held)

    def was_handed_back(self, request_id: str) -> bool:
        """This prefill was handed back by a notice (or its deadline) and has not ended yet."""
        return request_id in self._returned

    def deadline_came(self) -> tuple[str, ...]:
        """At the deadline: every prefill still held (kept ones that ran late) is handed back
        (counted; the caller cancels them) rather than cut when the process ends, so the gateway
        serves them on another pool node instead of falling back to a local prefill."""
        late = tuple(self._held)
        self._held.clear()
        self._returned.update(late)
        self.num_handed_back += len(late)
        if late:
            log.warning("notice: the deadline came with %d prefill(s) unfinished: handed back",
                        len(late))  # fmt: skip
        return late

    def notice(self, now_s: float, deadline_s: float) -> NoticePlan:
        """Which prefills to keep and which to hand back (counted; the caller cancels those)."""
        if self.deadline_s is None or deadline_s < self.deadline_s:
            self.deadline_s = deadline_s
        # The one(s) computing first (longest first), then the queue as it arrived.
        order = sorted(
            self._held.items(),
            key=lambda kv: (kv[1].started_s is None, kv[1].started_s or kv[1].arrived_s),
        )
        held = [
            HeldPrefill(
                rid,
                self.expected_s(h.num_tokens, h.kv_bytes),
                0.0 if h.started_s is None else now_s - h.started_s,
            )
            for rid, h in order
        ]
        margin_s = max(MIN_MARGIN_S, MARGIN_FRACTION * (self.deadline_s - now_s))
        plan = plan_notice(held, now_s, self.deadline_s - margin_s)
        for rid in plan.hand_back:
            self._held.pop(rid, None)
        self._returned.update(plan.hand_back)
        self.num_handed_back += len(plan.hand_back)
        log.warning(
            "notice: deadline in %.1f s; keeping %d prefill(s) (expected to end in %.1f s), "
            "handing %d back", self.deadline_s - now_s, len(plan.finish),
            plan.expected_end_s - now_s, len(plan.hand_back),
        )  # fmt: skip
        return plan
