"""The control plane only answers the deployment's own processes: a gateway and two workers started
as separate ``prfaas serve`` processes (the multi-host path), then attacked from outside: unsigned,
wrongly signed and replayed calls to the control listener and to the worker APIs are refused (401),
a fake node cannot take a real node's name, ``/internal/*`` is not on the client port; signed
operator calls (drain/resume) work; a file without ``psk`` is refused by ``prfaas serve``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from control_helpers import PSK, Cluster, cluster, deployment_dict

from prfaas.serve.auth import signed_headers
from prfaas.transfer import ConnectError, TransferConfig
from prfaas.transfer import Link as TransferLink

pytestmark = pytest.mark.timeout(120)

CONTROL_ROUTES = [
    ("POST", "/internal/register"),
    ("POST", "/internal/heartbeat"),
    ("GET", "/internal/nodes"),
    ("GET", "/internal/endpoints"),
    ("GET", "/internal/routes"),
    ("GET", "/internal/control"),
    ("POST", "/internal/nodes/d0/drain"),
    ("POST", "/internal/nodes/d0/resume"),
]
NODE_ROUTES = [
    ("POST", "/nodes/p0/prefill"),
    ("POST", "/nodes/d0/decode"),
    ("POST", "/nodes/p0/abort/r1"),
    ("POST", "/nodes/d0/role"),
    ("POST", "/prefix/pull"),
    ("POST", "/prefix/push"),
    ("POST", "/link/rate"),
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("control")) as c:
        yield c


def _fake_registration(live: Cluster) -> dict[str, object]:
    """A "node" claiming d0's name with the attacker's own address."""
    return {
        "process": "pd",
        "nodes": [{"node": "d0", "site": "pd", "role": "decode", "host": "127.0.0.1",
                   "http_port": 9, "transfer_port": 9}],
    }  # fmt: skip


def _assert_refused(r: httpx.Response, code: str) -> None:
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert error["type"] == "authentication_error"
    assert error["code"] == code
    assert error["param"].startswith("x-prfaas-")


@pytest.mark.parametrize("method, path", CONTROL_ROUTES)
def test_unsigned_control_calls_are_refused(live: Cluster, method: str, path: str) -> None:
    r = httpx.request(method, f"{live.control_url}{path}", json={}, timeout=5)
    _assert_refused(r, "missing_signature")


@pytest.mark.parametrize("method, path", CONTROL_ROUTES)
def test_control_routes_are_not_served_on_the_client_port(
    live: Cluster, method: str, path: str
) -> None:
    with live.signed() as c:  # even signed: the client listener has no /internal/* at all
        r = c.request(method, f"{live.url}{path}", json={})
    assert r.status_code == 404


def test_a_fake_node_cannot_take_a_real_nodes_name(live: Cluster) -> None:
    before = live.endpoints()["d0"]
    body = _fake_registration(live)
    unsigned = httpx.post(f"{live.control_url}/internal/register", json=body, timeout=5)
    _assert_refused(unsigned, "missing_signature")
    with live.signed(psk="attacker-key-0123456789") as c:
        _assert_refused(c.post(f"{live.control_url}/internal/register", json=body), "unknown_key")
        beat = {"process": "pd", "reports": [{"node": "d0", "site": "pd", "role": "decode",
                                              "draining": True}]}  # fmt: skip
        _assert_refused(c.post(f"{live.control_url}/internal/heartbeat", json=beat),
                        "unknown_key")  # fmt: skip
    after = live.endpoints()["d0"]
    assert after == before  # still the real node's address
    assert next(n for n in live.nodes() if n["node"] == "d0")["in_rotation"]


def test_a_replayed_control_call_is_refused(live: Cluster) -> None:
    url = f"{live.control_url}/internal/nodes/d0/resume"
    host = url.split("/")[2]
    headers = signed_headers(PSK.encode(), "POST", host, "/internal/nodes/d0/resume", b"",
                             time.time())  # fmt: skip
    first = httpx.post(url, headers=headers, timeout=5)
    assert first.status_code == 200, first.text
    again = httpx.post(url, headers=headers, timeout=5)
    _assert_refused(again, "replayed")


def test_a_signature_for_one_path_does_not_open_another(live: Cluster) -> None:
    host = live.control_url.split("/")[2]
    headers = signed_headers(PSK.encode(), "GET", host, "/internal/routes", b"", time.time())
    r = httpx.get(f"{live.control_url}/internal/endpoints", headers=headers, timeout=5)
    _assert_refused(r, "bad_signature")


@pytest.mark.parametrize("method, path", NODE_ROUTES)
def test_unsigned_worker_calls_are_refused(live: Cluster, method: str, path: str) -> None:
    node = "d0" if "d0" in path else "p0"
    base = live.node_url(node)
    r = httpx.request(method, f"{base}{path}", json={"gbps": 1, "role": "prefill"}, timeout=5)
    _assert_refused(r, "missing_signature")
    with live.signed(psk="attacker-key-0123456789") as c:
        _assert_refused(c.request(method, f"{base}{path}", json={"gbps": 1}), "unknown_key")


def test_worker_health_is_open_and_shows_no_ports(live: Cluster) -> None:
    ep = live.endpoints()["d0"]
    r = httpx.get(f"{live.node_url('d0')}/health", timeout=5)
    assert r.status_code == 200
    text = r.text
    assert "port" not in text
    for port in (ep["http_port"], ep["transfer_port"]):
        assert str(port) not in json.dumps(r.json()["nodes"])
    assert r.json()["auth_refused"] >= 1  # the refusals above were counted


def test_signed_worker_calls_pass_the_check(live: Cluster) -> None:
    # A signed command reaches the handler (409: a PrfaaS node can only prefill); its errors
    # have the OpenAI shape.
    with live.signed() as c:
        r = c.post(f"{live.node_url('pf0')}/nodes/pf0/role", json={"role": "decode"})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
        bad = c.post(f"{live.node_url('d0')}/link/rate", json={"gbps": -1})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "gbps"


def test_operator_drain_and_resume_are_signed_calls(live: Cluster) -> None:
    with live.signed() as c:
        drained = c.post(f"{live.control_url}/internal/nodes/p0/drain").json()
        assert drained["in_rotation"] is False
        assert "drained" in drained["why_not"]
        row = next(n for n in live.nodes() if n["node"] == "p0")
        assert not row["in_rotation"]
        resumed = c.post(f"{live.control_url}/internal/nodes/p0/resume").json()
        assert resumed["in_rotation"] is True and resumed["why_not"] == ""
        unknown = c.post(f"{live.control_url}/internal/nodes/nope/drain")
    assert unknown.status_code == 404
    assert "nope" in unknown.json()["error"]["message"]
    for key in ("node", "site", "role", "in_rotation", "why_not", "draining", "kv_used_bytes",
                "in_flight", "reported_queue_depth", "handshake_failures"):  # fmt: skip
        assert key in row


def test_refusals_and_handshake_failures_are_in_metrics(live: Cluster) -> None:
    httpx.get(f"{live.control_url}/internal/nodes", timeout=5)  # one more refusal
    text = httpx.get(f"{live.url}/metrics", timeout=5).text
    assert 'prfaas_control_auth_refused_total{code="missing_signature"}' in text
    assert 'prfaas_kv_handshake_failures{node="d0"}' in text


def test_prfaas_serve_refuses_a_file_without_psk(tmp_path: Path) -> None:
    path = tmp_path / "no-psk.yaml"
    path.write_text(yaml.safe_dump(deployment_dict(psk=None)))
    for args in (["--role", "gateway"], ["--role", "node", "--node", "d0"]):
        done = subprocess.run(
            [sys.executable, "-m", "prfaas.cli", "serve", "--config", str(path), *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "psk" in done.stderr and "Traceback" not in done.stderr


def test_requests_flow_through_signed_calls_on_both_routes(live: Cluster) -> None:
    for prompt in ("a" * 300, "b" * 20_000):  # local prefill, then offloaded to the PrfaaS site
        body = {"model": "paper-1t", "prompt": prompt, "max_tokens": 8}
        r = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    with live.signed() as c:
        done = c.get(f"{live.control_url}/internal/routes").json()
    assert [r["offloaded"] for r in done[-2:]] == [False, True]
    assert done[-1]["kv_bytes"] > 0


def test_a_kv_handshake_with_another_key_is_counted_and_shown(live: Cluster) -> None:
    port = live.endpoints()["d0"]["transfer_port"]
    config = TransferConfig(psk=b"attacker-key-0123456789", num_connections=1, timeout_s=5.0)

    async def attempt() -> None:
        with pytest.raises(ConnectError):
            link = await TransferLink.connect("127.0.0.1", port, config)
            await link.aclose()

    asyncio.run(attempt())

    def shown() -> bool:
        row = next(n for n in live.nodes() if n["node"] == "d0")
        return bool(row["handshake_failures"] >= 1)

    deadline = time.monotonic() + 10
    while not shown() and time.monotonic() < deadline:
        time.sleep(0.1)  # the next heartbeat carries it
    assert shown()
    text = httpx.get(f"{live.url}/metrics", timeout=5).text
    line = next(
        x for x in text.splitlines() if x.startswith('prfaas_kv_handshake_failures{node="d0"}')
    )
    assert float(line.split()[-1]) >= 1
