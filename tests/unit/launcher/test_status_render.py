"""``prfaas status``'s tables: every node with why it is out of rotation, links, routes and the
supervised processes; a port of 0 in the file is a usage error naming the fields."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prfaas.commands.gateway_access import load_with_ports
from prfaas.commands.status import human_bytes, render
from prfaas.errors import UsageError

pytestmark = pytest.mark.timeout(30)
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "two-site.yaml"

REPORT = {
    "gateway": {"url": "http://h:1", "control_url": "http://h:2", "ready": False,
                "not_ready_reason": "no decode node of site pd is in rotation"},
    "nodes": [
        {"node": "pf0", "site": "prfaas", "role": "prefill", "in_rotation": True, "why_not": "",
         "draining": False, "kv_used_bytes": 0, "in_flight": 0, "handshake_failures": 0},
        {"node": "d0", "site": "pd", "role": "decode", "in_rotation": False,
         "why_not": "drained by the operator", "draining": True, "kv_used_bytes": 2_500_000_000,
         "in_flight": 3, "handshake_failures": 2},
    ],
    "control": {"threshold_tokens": 8192, "ticks": 7, "threshold_updates": [], "role_changes": [],
                "window_rate_rps": 1.5, "window_requests": 4,
                "links": [{"link": "prfaas->pd", "capacity_bytes_per_s": 12.5e9,
                           "utilisation": 0.25, "backlog_bytes": 0, "rtt_s": 0.01,
                           "retransmit_rate": 0.0, "congested": False}]},
    "autoscale": [{"group": "prfaas", "action": "hold", "num_nodes": 0, "desired_nodes": 2,
                   "reason": "need 1.20 nodes, 2 on hand", "code": "steady",
                   "at_unix_s": 0.0, "num_serving": 2, "num_starting": 0, "num_draining": 0,
                   "last_change": {"group": "prfaas", "action": "add", "num_nodes": 1,
                                   "desired_nodes": 2, "reason": "need 1.50 nodes at 80%",
                                   "code": "load_up", "at_unix_s": 0.0, "num_serving": 1,
                                   "num_starting": 0, "num_draining": 0}}],
    "num_routes": 12,
    "routes": [{"request_id": "cmpl-1", "num_prompt_tokens": 60000, "num_cached_tokens": 512,
                "prefill_site": "prfaas", "prefill_node": "pf0", "decode_node": "d1",
                "offloaded": True, "attempts": 1}],
    "processes": {"file": "/w/processes.json", "launcher_pid": 42, "launcher_alive": True,
                  "stopped": False,
                  "processes": [{"name": "pd", "state": "failed", "pid": None, "restarts": 4,
                                 "last_exit": "exit status 1"}]},
}  # fmt: skip


def test_render_shows_every_part() -> None:
    text = render(REPORT)
    assert "NOT READY: no decode node of site pd is in rotation" in text
    d0 = next(line for line in text.splitlines() if line.startswith("d0 "))
    assert "out: drained by the operator" in d0 and "yes" in d0 and "2.5 GB" in d0
    assert d0.split()[-2:] == ["3", "2"]  # in flight, refused handshakes
    assert "threshold 8192 tokens" in text and "prfaas->pd" in text and "25%" in text
    assert "routes (last 1 of 12)" in text and "prfaas/pf0" in text
    group = next(line for line in text.splitlines() if line.startswith("prfaas "))
    assert "hold (steady)" in group and "need 1.20 nodes" in group and "add 1" in group
    pd = next(line for line in text.splitlines() if line.startswith("pd "))
    assert pd.split()[:4] == ["pd", "failed", "-", "4"] and "exit status 1" in pd


def test_human_bytes() -> None:
    assert [human_bytes(b) for b in (0, 999, 1000, 2.5e9, 3e15)] == [
        "0 B", "999 B", "1.0 KB", "2.5 GB", "3000.0 TB",
    ]  # fmt: skip


def test_a_file_with_port_0_points_at_the_resolved_file(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["gateway"] = {"port": 8000, "control_port": 0}
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UsageError, match=r"gateway\.control_port is 0 .*deployment\.resolved"):
        load_with_ports(path)
    assert load_with_ports(EXAMPLE).gateway.control_port == 8001


def test_a_route_whose_decode_recomputed_says_its_kv_went_unused() -> None:
    route = {**REPORT["routes"][0], "kv_recomputed": True}  # type: ignore[index]
    text = render({**REPORT, "num_kv_recomputed": 1, "routes": [route]})
    assert "routes (last 1 of 12; 1 decoded by recomputing, their KV unused)" in text
    assert "yes, KV unused: recomputed" in text


def test_render_shows_a_pool_tenants_tuner() -> None:
    choice = {"t_s": 90.0, "threshold_tokens": 6133, "changed": True, "share": 0.4,
              "expected_queueing_s": 1.5, "link_backlog_s": 0.25, "rate_rps": 1.2,
              "num_lengths": 24, "num_local_prefill": 1, "local_backlog_s": 0.5,
              "num_pool_nodes": 2}  # fmt: skip
    tuner = {"tuner": "coordinated", "ttft_target_s": 4.0, "period_s": 30.0,
             "min_samples": 50, "threshold_tokens": 6133, "num_choices": 3, "waiting": "",
             "choices": [choice]}  # fmt: skip
    control = dict(REPORT["control"])
    text = render({**REPORT, "control": {**control, "pool_tuner": tuner}})
    line = next(x for x in text.splitlines() if x.startswith("pool tuner coordinated"))
    assert "t 6133 tokens; 3 re-choices" in line and "share 0.400" in line
    assert "expected queueing 1.50 s" in line and "2 pool nodes" in line
    waiting = {**tuner, "num_choices": 0, "choices": [], "waiting": "12 of 50 lengths observed"}
    text = render({**REPORT, "control": {**control, "pool_tuner": waiting}})
    assert "0 re-choices; waiting: 12 of 50 lengths observed" in text
