"""`prfaas up` with `netns: true` (root): the PrfaaS site runs in its own network namespace, its KV
crosses a tbf-shaped veth with a delay line to the PD site, and stopping removes every namespace."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from live_helpers import control, launched, routes, timed_deployment

from prfaas.netlab import unavailable_reason

pytestmark = pytest.mark.timeout(180)


def test_prfaas_site_in_its_own_namespace_over_a_shaped_link(tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    base = timed_deployment()
    deployment = base.model_validate({**base.model_dump(), "netns": True})
    with launched(deployment, tmp_path) as live:
        namespace = live.testbed.ns_a
        pid = live.child("prfaas").proc.pid
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        for prompt in ("a" * 300, "b" * 30_000):
            body = {"model": "paper-1t", "prompt": prompt, "max_tokens": 16}
            r = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
        done = routes(live)
        assert [r["offloaded"] for r in done] == [False, True]
        assert done[1]["kv_bytes"] > 0
        # The transfer monitor's TCP_INFO reaches the policy's LinkState (after a heartbeat).
        rtts: list[float] = []
        for _ in range(30):
            links = control(live, "/internal/control")["links"]
            rtts = [link["rtt_s"] for link in links]
            if rtts and rtts[0] > 0:
                break
            time.sleep(0.1)
        assert rtts and rtts[0] > 0, rtts
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert namespace not in listed  # torn down with the deployment


def test_link_cut_for_seconds_stops_offloading_then_resumes(tmp_path: Path) -> None:
    """The veth between the sites goes down for 2 s (a real link cut): the PrfaaS node misses its
    heartbeats and leaves rotation, requests in the meantime are prefilled locally and none hangs;
    once the link is back the node re-registers and offloading resumes."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    base = timed_deployment()
    deployment = base.model_validate({**base.model_dump(), "netns": True})
    with launched(deployment, tmp_path) as live:
        ns = live.testbed.ns_a

        def ask(tag: str) -> dict[str, object]:
            body = {"model": "paper-1t", "prompt": tag * 30_000, "max_tokens": 16}
            r = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return routes(live)[-1]

        assert ask("a")["offloaded"]
        subprocess.run(["ip", "-n", ns, "link", "set", "dev", "a0", "down"], check=True)
        try:
            time.sleep(2.0)  # past heartbeat_timeout_s (1.5 s)
            t0 = time.monotonic()
            during = ask("b")
            assert not during["offloaded"] and time.monotonic() - t0 < 30
        finally:
            subprocess.run(["ip", "-n", ns, "link", "set", "dev", "a0", "up"], check=True)
        live.wait_nodes(30, ["pf0"])
        assert ask("c")["offloaded"]
