"""A spot group's availability trace replayed live under load, against the simulator (emulated
timed nodes at ``time_scale`` 0.5, live processes, ``prfaas up``'s own ``ElasticLoop`` in the
test's process so that its first look, the trace's origin, is known exactly).

The trace says 1, then 0, then 1 while long prompts arrive at a steady rate that needs a second
pool node: the autoscaler adds a spot node, the 0 interval gives it its notice (it finishes or
hands back what it holds), the next add falls back to the on-demand group, and the quiet after
the load drains it. Every request completes (offloaded or local); the same file simulated
(``prfaas sim``'s scenario restated in modelled seconds, the requests at their send times)
gives as many preemptions, scale-ups and scale-downs, within one each. Counts and events,
never durations."""

from __future__ import annotations

import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import launched, routes, timed_deployment
from test_live_elastic import _decisions

from prfaas.config import DeploymentConfig
from prfaas.serve.elastic.loop import ElasticLoop

pytestmark = pytest.mark.timeout(120)
TIME_SCALE = 0.5
"""Wall seconds per modelled second: a 10k-token prefill holds an emulated H200 0.4 s."""
INTERVAL_S = 5.0
TRACE = [1, 0] + [1] * 10
"""Spot is there for 5 s, gone for 5 s, then back (for 50 s: longer than the run)."""
GAP_S = 0.385
"""2.6 prompts of 10k tokens per second: 1.04 nodes' worth, so one node too few (80% target)
and two enough (the 60% drain floor keeps two)."""
LOAD_S = 11.0
"""The load runs through the trace's 1, 0 and back into 1 (from 10 s)."""


def deployment() -> DeploymentConfig:
    d = timed_deployment(time_scale=TIME_SCALE)
    auto = {"min_nodes": 1, "max_nodes": 4, "tick_s": 0.5, "rate_window_s": 2,
            "up_cooldown_s": 1, "down_cooldown_s": 2, "down_stabilisation_s": 1,
            "ttft_target_s": 4, "prior_tokens_per_s": 12_500 / TIME_SCALE,
            "groups": [{"name": "spot", "spot": True, "usd_per_hour": 12, "notice_s": 1,
                        "startup_s": 2,
                        "preemption": {"trace": TRACE, "interval_s": INTERVAL_S}},
                       {"name": "od", "startup_s": 2}]}  # fmt: skip
    return d.model_validate({**d.model_dump(mode="json"), "autoscale": auto})


def long_prompt(i: int) -> str:
    return f"{i:04d}" + "s" * 10_000  # byte tokens: over the 8192-token threshold, no shared prefix


def simulated(d: DeploymentConfig, sent_s: list[float], num_tokens: int, until_s: float) -> Any:
    """The run simulated from ``d``: ``prfaas sim``'s scenario restated in modelled seconds, the
    requests at their send times (seconds from the loop's start, restated likewise)."""
    from prfaas.commands.sim_elastic import elastic_scenario
    from prfaas.sim.elastic import Arrival, ElasticSim, in_modelled_seconds

    k = d.engine.wall_s_per_modelled_s
    sc = in_modelled_seconds(elastic_scenario(d, "the test's file"), k)
    arrivals = [Arrival(i, t / k, num_tokens) for i, t in enumerate(sorted(sent_s))]
    report = ElasticSim(sc, iter(arrivals), until_s / k).run()
    print("simulated:", [(round(e.at_s * k, 2), e.action, e.num_nodes, e.reason)
                         for e in report.scale_events])  # fmt: skip
    return report


def test_a_spot_trace_replayed_live_preempts_and_scales_as_simulated(tmp_path: Path) -> None:
    d = deployment()
    with launched(d, tmp_path) as live:
        loop = ElasticLoop(live)
        decided: list[tuple[float, str, int, str]] = []
        tick = loop.controller.tick

        def logged(obs: Any, now_s: float) -> Any:
            """The controller's look; its adds and drains kept for the printout."""
            decision = tick(obs, now_s)
            if decision.action.value != "hold":
                at_s = round(now_s - (loop.started_s or now_s), 2)
                decided.append((at_s, decision.action.value, decision.num_nodes, decision.reason))
            return decision

        loop.controller.tick = logged  # type: ignore[method-assign]
        body = {"model": "paper-1t", "max_tokens": 4}
        num = int(LOAD_S / GAP_S)
        sent_at: list[float] = [0.0] * num
        begin = time.monotonic()
        loop.start()  # its start is time 0 (``started_s``, set at its first look a tick later)

        def send(i: int) -> int:
            time.sleep(max(0.0, begin + 0.2 + i * GAP_S - time.monotonic()))  # open loop
            sent_at[i] = time.monotonic()
            r = httpx.post(f"{live.url}/v1/completions",
                           json={**body, "prompt": long_prompt(i)}, timeout=60)  # fmt: skip
            return r.status_code

        try:
            with ThreadPoolExecutor(num) as pool:
                codes = list(pool.map(send, range(num)))
            assert codes == [200] * num  # every request completed
            deadline = time.monotonic() + 30
            while loop.provider.nodes() or not loop.controller.counts.drained:
                assert time.monotonic() < deadline, [n.name for n in loop.provider.nodes()]
                time.sleep(0.1)  # the quiet drains the pool back to its own node
        finally:
            loop.stop()
        assert loop.started_s is not None
        t0 = loop.started_s
        live_s = time.monotonic() - t0
        found = routes(live)
        assert len(found) == num and {r["prefill_site"] for r in found} <= {"prfaas", "pd"}
        served = Counter(str(r["prefill_node"]) for r in found)
        tokens = {int(r["num_prompt_tokens"]) for r in found}
        assert len(tokens) == 1, tokens
        metrics = httpx.get(f"{live.url}/metrics", timeout=10).text
    counts = loop.controller.counts
    print("live:", decided)
    print("live: added", counts.by_group, "fallbacks", counts.fallbacks, "drained",
          counts.drained, "preempted", loop.num_preempted, "prefills by node", served)  # fmt: skip
    assert loop.num_preempted >= 1  # the 0 interval noticed the spot node(s)
    shown = re.findall(
        r'^prfaas_autoscale_preemptions_total\{group="(\w+)"\} (\S+)$', metrics, re.M
    )
    assert {g: float(n) for g, n in shown} == {"spot": float(loop.num_preempted)}, shown
    assert counts.by_group.get("spot", 0) >= 1 and counts.fallbacks >= 1  # then on demand
    live_events = (loop.num_preempted, _decisions(metrics, "add"), _decisions(metrics, "drain"))
    r = simulated(d, [max(0.0, t - t0) for t in sent_at], tokens.pop(), 2 * live_s)
    sim_events = (r.num_preemptions, r.num_scale("add"), r.num_scale("drain"))
    print(f"preemptions, scale-ups, scale-downs: live {live_events}, simulated {sim_events}")
    assert r.num_completed == r.num_requests == num
    for live_n, sim_n in zip(live_events, sim_events, strict=True):
        assert abs(live_n - sim_n) <= 1, (live_events, sim_events)
