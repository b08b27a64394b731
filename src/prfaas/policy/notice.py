"""``plan_notice``: what a pool node does with the prefills it holds when its notice comes (a spot
preemption: SIGTERM with its group's ``notice_s``, or a signed call with ``deadline_s``).

It takes no new prefill. Of those it holds, in its own order (the one computing first, then its
queue as it arrived), each is expected to end after those kept before it: its prefill and KV
stream, less what it has already done. One that ends by the deadline is kept (finished there);
one that would not is handed back to the gateway, which serves it on another node, and then costs
this node nothing, so the ones after it move up. The elastic simulator's rule for the one prefill
a simulated node holds, generalised to a queue.

Pure: no clock (``now_s`` is passed in), no I/O; must not import serve, torch or asyncio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HeldPrefill:
    request_id: str
    expected_s: float
    """Its prefill and KV stream from start to the last byte, alone (the node's estimate)."""
    done_s: float = 0.0
    """How long it has been computing (0 while queued)."""

    def __post_init__(self) -> None:
        if self.expected_s < 0 or self.done_s < 0:
            raise ValueError(
                f"{self.request_id}: expected_s ({self.expected_s}) and done_s ({self.done_s}) "
                "must be >= 0"
            )


@dataclass(frozen=True, slots=True)
class NoticePlan:
    finish: tuple[str, ...]
    """Expected to end by the deadline: kept."""
    hand_back: tuple[str, ...]
    """Would not: handed back to the gateway now."""
    expected_end_s: float
    """When the last kept one is expected to end (``now_s`` when none is kept)."""


def plan_notice(held: Sequence[HeldPrefill], now_s: float, deadline_s: float) -> NoticePlan:
    """Keep, in order, each prefill expected to end by ``deadline_s`` after those kept before
    it; hand back the rest."""
    finish: list[str] = []
    hand_back: list[str] = []
    t = now_s
    for h in held:
        end = t + max(0.0, h.expected_s - h.done_s)
        if end <= deadline_s:
            finish.append(h.request_id)
            t = end
        else:
            hand_back.append(h.request_id)
    return NoticePlan(tuple(finish), tuple(hand_back), t)
