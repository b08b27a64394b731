"""``LiveObserver``: a live site's observation from the gateway's node rows and route records and
the provider's nodes: serving and starting counts, offered uncached tokens/s of long prompts
(wherever they went) over the rate window, queued tokens from queue depths."""

from __future__ import annotations

import pytest

from prfaas.serve.elastic.observe import LiveObserver
from prfaas.serve.elastic.provider import NodePhase, ProvidedNode

pytestmark = pytest.mark.timeout(30)


def row(node: str, in_rotation: bool = True, depth: int = 0) -> dict[str, object]:
    return {"node": node, "site": "prfaas", "role": "prefill", "in_rotation": in_rotation,
            "queue_depth": depth}  # fmt: skip


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
