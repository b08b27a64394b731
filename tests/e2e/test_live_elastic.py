"""The local elastic provider on a live deployment (emulated timed nodes): a node added at run
time gets a generated name and a free port, is held out of rotation until its start-up has
passed, then serves offloaded prefills; drained, it is removed from the supervisor's desired set
and its process is gone; every request completed. Counts and events, never durations."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import launched, routes, timed_deployment

from prfaas.config import load_deployment
from prfaas.serve.control_client import ControlClient
from prfaas.serve.elastic.local import LocalGroup, LocalProvider
from prfaas.serve.elastic.provider import NodePhase
from prfaas.serve.launch_resolved import RESOLVED_NAME
from prfaas.serve.launcher import Launcher, RestartPolicy

pytestmark = pytest.mark.timeout(180)
STARTUP_S = 6.0
BURST = 32
GAP_S = 0.0625
"""The autoscaling burst: 32 long prompts sent 62.5 ms apart (16/s for 2 s), open loop."""


def _resolved_nodes(live: Launcher) -> set[str]:
    d = load_deployment(live.workdir / RESOLVED_NAME)
    return {n.name for s in d.sites for n in s.nodes}


def _decisions(metrics: str, action: str) -> int:
    """The gateway's count of autoscaler decisions of ``action`` (every reason)."""
    pattern = rf'^prfaas_autoscale_decisions_total\{{(?=[^}}]*action="{action}")[^}}]*\}} (\S+)$'
    return int(sum(float(v) for v in re.findall(pattern, metrics, re.M)))


def _simulated(d: Any, num_tokens: int, live_s: float) -> tuple[int, int]:
    """(scale-ups, scale-downs) of the burst simulated from ``d``: ``prfaas sim``'s scenario,
    its seconds the live loop's wall seconds restated as modelled ones, the requests' send
    times likewise, run past the live run's length (after the burst, only drains to the
    minimum can follow)."""
    from prfaas.commands.sim_elastic import elastic_scenario
    from prfaas.sim.elastic import Arrival, ElasticSim, in_modelled_seconds

    k = d.engine.wall_s_per_modelled_s
    sc = in_modelled_seconds(elastic_scenario(d, "the test's file"), k)
    arrivals = [Arrival(i, i * GAP_S / k, num_tokens) for i in range(BURST)]
    report = ElasticSim(sc, iter(arrivals), 2 * live_s / k).run()
    print("simulated:", sc.groups, [(e.at_s, e.action, e.num_nodes, e.reason)
                                    for e in report.scale_events])  # fmt: skip
    return report.num_scale("add"), report.num_scale("drain")


def long_prompt(i: int) -> str:
    return f"{i:04d}" + "y" * 10_000  # byte tokens: over the 8192-token threshold, no shared prefix


def test_a_node_added_at_run_time_is_held_then_serves_then_drains_away(tmp_path: Path) -> None:
    with launched(timed_deployment(), tmp_path, restart=RestartPolicy()) as live:
        provider = LocalProvider(live, "prfaas", [LocalGroup("od", STARTUP_S)], time.monotonic)
        name = provider.add("od")
        assert name == "prfaas-od-0"
        assert name in _resolved_nodes(live)
        held_seen = False
        registered_early = False  # before its start-up had passed: then it must be held
        deadline = time.monotonic() + 60
        while provider.nodes()[0].phase is NodePhase.STARTING:
            assert time.monotonic() < deadline, "the added node never entered rotation"
            provider.poll()
            rows = {r["node"]: r for r in live.nodes()}
            node = provider.nodes()[0]
            if name in rows and node.phase is NodePhase.STARTING:
                held_seen = held_seen or not rows[name]["in_rotation"]
                registered_early |= time.monotonic() - node.started_s < STARTUP_S - 1
            time.sleep(0.1)
        # Registered before its start-up had passed (a second to spare for the poll): held out.
        # (On a host so busy that the node took longer to start, there was nothing to hold.)
        assert held_seen or not registered_early
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
        assert name not in _resolved_nodes(live)  # gone from the file its processes read


def test_prfaas_up_with_autoscale_grows_on_a_burst_and_shrinks_after(tmp_path: Path) -> None:
    """``prfaas up FILE`` with ``autoscale:`` runs the loop: a burst of long prompts adds nodes
    (generated names, shown by ``prfaas status``), the quiet after drains them; every request
    completed; each decision is in the gateway's ``/metrics`` (the desired size KEDA reads, the
    decisions by reason) and the last one per group in ``prfaas status``.

    Then the same burst (its requests' send times, open loop) simulated from the same file
    (``prfaas sim``'s scenario, restated in modelled seconds: the live loop's seconds are wall
    seconds, ``time_scale`` 0.05 of a modelled one) makes as many scale-ups and as many
    scale-downs, within one each."""
    from concurrent.futures import ThreadPoolExecutor

    import yaml
    from test_live_supervise import Up, prfaas, until

    raw = timed_deployment().model_dump(mode="json", exclude_none=True)
    raw["autoscale"] = {"min_nodes": 1, "max_nodes": 3, "tick_s": 0.5, "rate_window_s": 2,
                        "up_cooldown_s": 1,
                        "down_cooldown_s": 2, "down_stabilisation_s": 1,
                        "prior_tokens_per_s": 20_000, "ttft_target_s": 2,
                        "groups": [{"name": "od", "startup_s": 1.0}]}  # fmt: skip
    path = tmp_path / "elastic.yaml"
    path.write_text(yaml.safe_dump(raw))
    up = Up(path, tmp_path / "work")
    try:
        up.wait_for("autoscaling the PrfaaS pool", timeout_s=90)
        resolved = str(up.workdir / "deployment.resolved.yaml")
        client = ControlClient(load_deployment(Path(resolved)))
        url = client.client_url
        body = {"model": "paper-1t", "max_tokens": 4}

        t0 = time.monotonic()

        def send(i: int) -> int:
            time.sleep(max(0.0, t0 + i * GAP_S - time.monotonic()))  # open loop: on schedule
            r = httpx.post(f"{url}/v1/completions", json={**body, "prompt": long_prompt(i)},
                           timeout=60)  # fmt: skip
            return r.status_code

        def members(kind: str) -> set[str]:
            """The added nodes the supervisor ``started`` / ``removed`` (its events)."""
            up.processes()  # remember their process groups, for the cleanup
            doc = json.loads((up.workdir / "processes.json").read_text())
            return {e["member"] for e in doc["events"]
                    if e["kind"] == kind and e["member"].startswith("prfaas-od-")}  # fmt: skip

        with ThreadPoolExecutor(BURST) as pool:
            codes = list(pool.map(send, range(BURST)))
        assert codes == [200] * BURST
        until("a node added at run time", lambda: members("started"), timeout_s=30)

        def shrunk() -> bool:
            gone = members("started") <= members("removed")
            (group,) = client.autoscale()
            change = group["last_change"]
            return gone and change is not None and change["action"] == "drain"

        try:
            until("the added nodes drained away", shrunk, timeout_s=60)
        except AssertionError:
            print(json.dumps(client.autoscale(), indent=1), up.processes().keys())
            raise
        live_s = time.monotonic() - t0
        r = prfaas("status", resolved, "--json")  # the command shows it too
        assert r.returncode == 0, r.stderr
        (group,) = json.loads(r.stdout)["autoscale"]
        assert group["desired_nodes"] >= 1 and group["reason"] and group["at_unix_s"] > 0
        assert group["last_change"]["action"] == "drain"
        assert "autoscale:" in prfaas("status", resolved).stdout
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'prfaas_autoscale_desired_nodes{group="pool"}' in metrics
        assert 'action="add",group="pool",reason="load_up"' in metrics
        assert 'action="drain",group="pool",reason="load_down"' in metrics
        tokens = {r["num_prompt_tokens"] for r in client.routes()}
        assert len(tokens) == 1, tokens
        live_events = (_decisions(metrics, "add"), _decisions(metrics, "drain"))
        sim_events = _simulated(load_deployment(Path(resolved)), tokens.pop(), live_s)
        print(f"scale-ups, scale-downs: live {live_events}, simulated {sim_events}")
        assert abs(live_events[0] - sim_events[0]) <= 1, (live_events, sim_events)
        assert abs(live_events[1] - sim_events[1]) <= 1, (live_events, sim_events)
        client.close()
    finally:
        with contextlib.suppress(OSError, ValueError):
            up.processes()  # every process group it started, for the cleanup
        up.stop()
