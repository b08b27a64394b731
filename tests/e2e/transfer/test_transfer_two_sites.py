"""Two sites in network namespaces: shaped + delayed link, separate processes, byte-exact KV.

Skipped (with the reason) where namespaces cannot be made: not root, no ``ip``/``tc``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prfaas.netlab import TwoSiteTestbed, sweep_stale, unavailable_reason
from prfaas.netlab.netns import PREFIX, STATE_DIR

_WHY = unavailable_reason()
pytestmark = [
    pytest.mark.skipif(_WHY is not None, reason=_WHY or ""),
    pytest.mark.timeout(90),
]
PEER = str(Path(__file__).with_name("transfer_peer.py"))


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def test_kv_crosses_a_shaped_delayed_link_byte_exact() -> None:
    num = 3
    with TwoSiteTestbed(rate_mbit=200, one_way_delay_s=0.01) as tb:
        assert tb.probe_rtt_s() >= 0.02  # the delay line cannot deliver early
        rx = tb.popen("b", [sys.executable, PEER, "rx", tb.ip_b, str(num)],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert rx.stdout is not None
        port = json.loads(rx.stdout.readline())["port"]
        argv = [sys.executable, PEER, "tx", tb.ip_b, str(num), str(port), str(20e6)]
        sent = subprocess.run(tb.netns_argv("a", argv), capture_output=True, text=True, timeout=60)
        if sent.returncode != 0:  # once in a loaded CI run: the receiver's side says why
            rx.kill()
            _, rx_err = rx.communicate(timeout=10)
            raise AssertionError(f"tx: {sent.stderr[-2000:]}\nrx: {rx_err[-2000:]}")
        got = [json.loads(rx.stdout.readline()) for _ in range(num)]
        assert rx.wait(timeout=20) == 0
        want = [json.loads(line) for line in sent.stdout.splitlines()]
        assert sorted(got, key=str) == sorted(want, key=str) and len(got) == num
        names = {tb.ns_a, tb.ns_b, tb.ns_m}
        helpers = list(tb._helpers)
    assert not names & _netns()
    assert all(p.poll() is not None for p in helpers)
    assert not (STATE_DIR / f"{tb.run_id}.json").exists()


def test_teardown_runs_when_the_body_fails() -> None:
    with pytest.raises(RuntimeError, match="boom"), TwoSiteTestbed(one_way_delay_s=0.001) as tb:
        names = {tb.ns_a, tb.ns_b, tb.ns_m}
        raise RuntimeError("boom")
    assert not names & _netns()


def test_stale_namespaces_of_dead_runs_are_swept() -> None:
    dead = 4_000_000  # above pid_max: never alive
    name = f"{PREFIX}{dead}xdeadbeefa"
    subprocess.run(["ip", "netns", "add", name], check=True)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state = STATE_DIR / f"{PREFIX}{dead}xdeadbeef.json"
    state.write_text(json.dumps({"run_id": f"{PREFIX}{dead}xdeadbeef", "owner_pid": dead,
                                 "helper_pids": [os.getpid()]}))  # fmt: skip
    removed = sweep_stale()
    assert name in removed and name not in _netns() and not state.exists()
