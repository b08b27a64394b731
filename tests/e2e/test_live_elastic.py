"""The local elastic provider on a live deployment (emulated timed nodes): a node added at run
time gets a generated name and a free port, is held out of rotation until its start-up has
passed, then serves offloaded prefills; drained, it is removed from the supervisor's desired set
and its process is gone; every request completed. Counts and events, never durations."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from live_helpers import launched, routes, timed_deployment

from prfaas.serve.elastic.local import LocalGroup, LocalProvider
from prfaas.serve.elastic.provider import NodePhase
from prfaas.serve.launcher import RestartPolicy

pytestmark = pytest.mark.timeout(180)
STARTUP_S = 3.0


def long_prompt(i: int) -> str:
    return f"{i:04d}" + "y" * 10_000  # byte tokens: over the 8192-token threshold, no shared prefix


def test_a_node_added_at_run_time_is_held_then_serves_then_drains_away(tmp_path: Path) -> None:
    with launched(timed_deployment(), tmp_path, restart=RestartPolicy()) as live:
        provider = LocalProvider(live, "prfaas", [LocalGroup("od", STARTUP_S)], time.monotonic)
        name = provider.add("od")
        assert name == "prfaas-od-0"
        held_seen = False
        deadline = time.monotonic() + 60
        while provider.nodes()[0].phase is NodePhase.STARTING:
            assert time.monotonic() < deadline, "the added node never entered rotation"
            provider.poll()
            rows = {r["node"]: r for r in live.nodes()}
            if name in rows and provider.nodes()[0].phase is NodePhase.STARTING:
                held_seen = held_seen or not rows[name]["in_rotation"]
            time.sleep(0.1)
        assert held_seen  # registered before its start-up had passed, and held out
        rows = {r["node"]: r for r in live.nodes()}
        assert rows[name]["in_rotation"]
        assert name in {s.name for s in live.status()}
        live.control.drain("pf0")  # only the added node serves the PrfaaS site now
        body = {"model": "paper-1t", "max_tokens": 4}
        codes = [
            httpx.post(f"{live.url}/v1/completions", json={**body, "prompt": long_prompt(i)},
                       timeout=60).status_code
            for i in range(3)
        ]  # fmt: skip
        assert codes == [200, 200, 200]
        assert any(r.get("prefill_node") == name for r in routes(live))
        provider.drain(name)
        deadline = time.monotonic() + 30
        while provider.nodes():
            assert time.monotonic() < deadline, "the drained node was never removed"
            provider.poll()
            time.sleep(0.1)
        assert name not in {s.name for s in live.status()}


def test_a_burst_grows_the_pool_and_the_quiet_after_shrinks_it(tmp_path: Path) -> None:
    """The loop ``prfaas up`` runs for ``autoscale:``: a burst of long prompts adds nodes, the
    quiet after it drains them; every request completed."""
    from concurrent.futures import ThreadPoolExecutor

    from prfaas.serve.elastic.loop import ElasticLoop

    d = timed_deployment()
    auto = {"min_nodes": 1, "max_nodes": 3, "tick_s": 0.5, "up_cooldown_s": 1,
            "down_cooldown_s": 2, "down_stabilisation_s": 1, "prior_tokens_per_s": 20_000,
            "ttft_target_s": 2, "groups": [{"name": "od", "startup_s": 1.0}]}  # fmt: skip
    d = d.model_validate({**d.model_dump(mode="json"), "autoscale": auto})
    with launched(d, tmp_path, restart=RestartPolicy()) as live:
        loop = ElasticLoop(live)
        loop.start()
        try:
            body = {"model": "paper-1t", "max_tokens": 4}

            def send(i: int) -> int:
                r = httpx.post(f"{live.url}/v1/completions",
                               json={**body, "prompt": long_prompt(i)}, timeout=60)  # fmt: skip
                return r.status_code

            with ThreadPoolExecutor(8) as pool:
                codes = list(pool.map(send, range(40)))
            assert codes == [200] * 40
            deadline = time.monotonic() + 60
            while loop.controller.counts.added == 0 or loop.provider.nodes():
                assert time.monotonic() < deadline, (loop.controller.counts, loop.provider.nodes())
                time.sleep(0.2)
        finally:
            loop.stop()
        c = loop.controller.counts
        assert c.added >= 1 and c.drained >= 1
        assert not any(s.name.startswith("prfaas-od-") for s in live.status())
