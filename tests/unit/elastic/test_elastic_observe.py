"""``LiveObserver``: a live site's observation from the gateway's node rows and route records and
the provider's nodes: serving and starting counts, offered uncached tokens/s of long prompts
(wherever they went) over the rate window, queued tokens from queue depths."""

from __future__ import annotations

import pytest

from prfaas.serve.elastic.observe import LiveObserver
from prfaas.serve.elastic.provider import NodePhase, ProvidedNode

pytestmark = pytest.mark.timeout(30)


def row(node: str, in_rotation: bool = True, depth: int = 0, batch: int = 0) -> dict[str, object]:
    return {"node": node, "site": "prfaas", "role": "prefill", "in_rotation": in_rotation,
            "queue_depth": depth, "batch_size": batch}  # fmt: skip


def route(rid: str, prompt: int, cached: int = 0) -> dict[str, object]:
    return {"request_id": rid, "num_prompt_tokens": prompt, "num_cached_tokens": cached}


def test_counts_offered_tokens_per_second_over_the_window() -> None:
    obs = LiveObserver("prfaas", 8192, {"od": 30.0}, rate_window_s=20.0, tick_s=10.0)
    provided = [
        ProvidedNode("prfaas-od-0", "od", False, NodePhase.SERVING),
        ProvidedNode("prfaas-od-1", "od", False, NodePhase.STARTING, started_s=95.0),
        ProvidedNode("prfaas-od-2", "od", False, NodePhase.DRAINING),
    ]
    rows = [row("pf0", depth=2), row("prfaas-od-0"), row("prfaas-od-1"), row("prfaas-od-2", False),
            {"node": "p0", "site": "pd", "role": "prefill", "in_rotation": True}]  # fmt: skip
    first = obs.observe(rows, [route("a", 20_000)], provided, 100.0)
    assert first.num_serving == 2  # pf0 and od-0; od-1 is held while it starts
    assert first.starting_remaining_s == (25.0,) and first.num_draining == 1
    # a's 20,000 over the tick since the loop started (the first look is one tick in)
    assert first.offered_tokens_per_s == pytest.approx(2_000.0)
    routes = [route("a", 20_000), route("b", 30_000, cached=10_000), route("c", 100)]
    second = obs.observe(rows, routes, provided, 110.0)
    # + b's 20,000 uncached tokens (a was seen, c is short): 40,000 over the 20 s window.
    assert second.offered_tokens_per_s == pytest.approx(2_000.0)
    assert second.queued_uncached_tokens == 2 * 20_000
    third = obs.observe(rows, routes, provided, 125.0)
    assert third.offered_tokens_per_s == pytest.approx(1_000.0)  # a fell out of the window
    fourth = obs.observe(rows, routes, provided, 150.1)
    assert fourth.offered_tokens_per_s == 0.0


def test_queued_tokens_are_the_prefills_waiting_not_those_running() -> None:
    """A row's queue depth is the gateway's count of prefills dispatched to the node and not done
    (running ones too); the simulator's queue holds only those waiting: the batch the node
    reports running is taken off (never below 0: a report lags by up to a heartbeat)."""
    obs = LiveObserver("prfaas", 8192, {}, rate_window_s=20.0, tick_s=10.0)
    obs.observe([row("pf0")], [route("a", 20_000)], [], 10.0)  # the mean offered: 20,000
    rows = [row("pf0", depth=3, batch=1), row("pf1", depth=1, batch=1), row("pf2", batch=1)]
    assert obs.observe(rows, [], [], 20.0).queued_uncached_tokens == 2 * 20_000


def speed_row(node: str, tokens: int, busy_s: float) -> dict[str, object]:
    return {**row(node), "prefilled_tokens": tokens, "prefill_busy_s": busy_s}


def test_speed_is_tokens_over_busy_seconds_of_every_node_ever_seen() -> None:
    obs = LiveObserver("prfaas", 8192, {}, rate_window_s=20.0, tick_s=10.0)
    assert obs.observe([row("pf0")], [], [], 10.0).prefill_tokens_per_s_per_node is None
    first = obs.observe(
        [speed_row("pf0", 30_000, 2.0), speed_row("pf1", 10_000, 2.0)], [], [], 20.0
    )
    assert first.prefill_tokens_per_s_per_node == pytest.approx(40_000 / 4.0)
    # pf1 scaled away: what it counted stays; pf0 restarted, counting from zero again.
    rows = [speed_row("pf0", 5_000, 1.0)]
    assert obs.observe(rows, [], [], 30.0).prefill_tokens_per_s_per_node == pytest.approx(
        45_000 / 5.0
    )
    other_site = {**speed_row("p0", 10**9, 1.0), "site": "pd"}  # home prefill: not the group's
    last = obs.observe([*rows, other_site], [], [], 40.0)
    assert last.prefill_tokens_per_s_per_node == pytest.approx(45_000 / 5.0)
