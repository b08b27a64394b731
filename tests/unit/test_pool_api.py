"""The pool front door's API v1 over HTTP (in process): signed per-tenant keys (401 for a wrong or
unknown key), and isolation: a tenant's key cannot submit as the other, reach the other's
receiver, or read the other's outcome or feedback; refusals carry a reason, the epoch and a retry
hint; a bad field is a 400 naming it."""

from __future__ import annotations

import json
import math
import time

import pytest
from fastapi.testclient import TestClient

from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.pool import FrontDoor
from prfaas.pool.app import TenantKeys, create_app
from prfaas.serve.auth import KEY_ID_HEADER, signed_headers
from prfaas.serve.node.messages import pack_tokens

pytestmark = pytest.mark.timeout(60)

KEY_A, KEY_B = b"a" * 32, b"b" * 32


@pytest.fixture
def client() -> TestClient:
    shape = PoolShape(
        (GroupShape("g", "m", 1),),
        1e9,
        (TenantShare("a", max_queued_tokens=5000), TenantShare("b")),
    )
    door = FrontDoor(shape, epoch=3, lease_s=30.0, fingerprints={"m": {"block_tokens": "512"}})
    keys = TenantKeys({"ka": ("a", KEY_A), "kb": ("b", KEY_B)})
    app = create_app(door, keys, lambda model, n: (n / 1000, n * 100), clock=lambda: 10.0)
    return TestClient(app)


def _call(c: TestClient, method: str, path: str, key_id: str, key: bytes, body=None):
    content = b"" if body is None else json.dumps(body).encode()
    headers = signed_headers(key, method, "testserver", path, content, time.time(), key_id=key_id)
    if body is not None:
        headers["content-type"] = "application/json"
    return c.request(method, path, content=content, headers=headers)


def _register(c: TestClient) -> None:
    for kid, key, name in (("ka", KEY_A, "a-d0"), ("kb", KEY_B, "b-d0")):
        recs = {"receivers": [{"name": name, "host": "10.0.0.1", "transfer_port": 9000}]}
        r = _call(c, "POST", "/v1/receivers", kid, key, recs)
        assert r.status_code == 200 and r.json()["epoch"] == 3


def _sub(tenant: str, rid: str, receiver: str, tokens: int = 1000) -> dict:
    return {"tenant": tenant, "request_id": rid, "model": "m",
            "fingerprint": {"block_tokens": "512"}, "num_uncached_tokens": tokens,
            "receiver": receiver, "session": "s",
            "tokens": pack_tokens([7] * max(tokens, 1))}  # fmt: skip


def test_wrong_or_unknown_key_is_401(client: TestClient) -> None:
    r = _call(client, "POST", "/v1/heartbeat", "ka", KEY_B)  # a's id, b's key
    assert r.status_code == 401 and r.json()["error"]["code"] == "bad_signature"
    r = _call(client, "POST", "/v1/heartbeat", "kz", KEY_A)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unknown_key"
    r = client.post("/v1/heartbeat", headers={KEY_ID_HEADER: "ka"})  # unsigned
    assert r.status_code == 401


def test_a_tenant_key_cannot_act_for_or_read_the_other(client: TestClient) -> None:
    _register(client)
    ok = _call(client, "POST", "/v1/submit", "kb", KEY_B, _sub("b", "r1", "b-d0"))
    assert ok.status_code == 200 and ok.json()["epoch"] == 3 and "accepted" in ok.json()
    as_b = _call(client, "POST", "/v1/submit", "ka", KEY_A, _sub("b", "r2", "b-d0"))
    assert as_b.status_code == 403 and as_b.json()["error"]["code"] == "wrong_tenant"
    to_b = _call(client, "POST", "/v1/submit", "ka", KEY_A, _sub("a", "r3", "b-d0"))
    assert to_b.status_code == 403 and to_b.json()["error"]["code"] == "receiver_not_registered"
    mine = _call(client, "GET", "/v1/outcome/r1", "kb", KEY_B)
    assert mine.status_code == 200 and mine.json()["state"] == "queued"
    theirs = _call(client, "GET", "/v1/outcome/r1", "ka", KEY_A)
    assert theirs.status_code == 404
    fb = _call(client, "GET", "/v1/feedback", "ka", KEY_A).json()
    assert fb["tenant"] == "a" and fb["queued_tokens"] == 0  # b's queue is not a's
    # The pool's shape, for the tenant's tuner: 1e9 bytes/s of egress is 8 Gbps.
    assert fb["pool"] == {"egress_gbps": 8.0, "groups": [{"model": "m", "num_nodes": 1}]}


def test_refusals_carry_reason_epoch_and_retry_hint(client: TestClient) -> None:
    _register(client)
    for i in range(5):
        r = _call(client, "POST", "/v1/submit", "ka", KEY_A, _sub("a", f"r{i}", "a-d0"))
        assert r.status_code == 200
    over = _call(client, "POST", "/v1/submit", "ka", KEY_A, _sub("a", "r9", "a-d0"))
    assert over.status_code == 429
    body = over.json()
    assert body["error"]["code"] == "over_queued_tokens_cap" and body["epoch"] == 3
    assert body["retry_after_s"] > 0 and "retry-after" in over.headers
    fp = _sub("a", "r10", "a-d0")
    fp["fingerprint"] = {"block_tokens": "256"}
    r = _call(client, "POST", "/v1/submit", "ka", KEY_A, fp)
    assert r.status_code == 409 and "fingerprint.block_tokens" in r.json()["error"]["message"]
    bad = _sub("a", "r11", "a-d0", tokens=0)
    r = _call(client, "POST", "/v1/submit", "ka", KEY_A, bad)
    assert r.status_code == 400 and r.json()["error"]["param"] == "num_uncached_tokens"
    r = _call(client, "POST", "/v1/submit", "ka", KEY_A, {**_sub("a", "r12", "a-d0"), "model": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model"


def test_a_tenant_aborts_its_own_request_only(client: TestClient) -> None:
    _register(client)
    assert (
        _call(client, "POST", "/v1/submit", "ka", KEY_A, _sub("a", "r1", "a-d0")).status_code == 200
    )
    theirs = _call(client, "POST", "/v1/abort/r1", "kb", KEY_B)
    assert theirs.status_code == 404 and theirs.json()["error"]["code"] == "unknown_request"
    mine = _call(client, "POST", "/v1/abort/r1", "ka", KEY_A)
    assert mine.status_code == 200 and mine.json() == {"epoch": 3, "request_id": "r1",
                                                       "state": "aborted"}  # fmt: skip
    out = _call(client, "GET", "/v1/outcome/r1", "ka", KEY_A).json()
    assert out["state"] == "aborted" and out["reason"] == "client_gone"
    assert _call(client, "POST", "/v1/abort/r1", "ka", KEY_A).status_code == 404  # once
    assert _call(client, "POST", "/v1/abort/r1", "kz", KEY_A).status_code == 401


def test_a_key_replaced_by_a_reload_is_refused_and_the_new_one_accepted() -> None:
    shape = PoolShape((GroupShape("g", "m", 1),), 1e9, (TenantShare("a"), TenantShare("b")))
    door = FrontDoor(shape, epoch=3, lease_s=30.0, fingerprints={"m": {"block_tokens": "512"}})
    keys = TenantKeys({"ka": ("a", KEY_A), "kb": ("b", KEY_B)})
    c = TestClient(create_app(door, keys, lambda m, n: (n / 1000, n * 100), clock=lambda: 10.0))
    assert _call(c, "POST", "/v1/heartbeat", "ka", KEY_A).status_code == 200
    new_a = b"n" * 32
    keys.replace({"ka2": ("a", new_a), "kb": ("b", KEY_B)})
    r = _call(c, "POST", "/v1/heartbeat", "ka", KEY_A)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unknown_key"
    assert _call(c, "POST", "/v1/heartbeat", "ka2", new_a).status_code == 200
    assert _call(c, "POST", "/v1/heartbeat", "kb", KEY_B).status_code == 200
    assert keys.key_ids() == {"a": ["ka2"], "b": ["kb"]}


def test_a_tenant_tells_its_link_with_its_receivers_and_reads_only_its_own() -> None:
    """``POST /v1/receivers`` takes the tenant's own link (``link.gbps`` > 0, else a 400 naming
    it; left out: an older caller, paced by the egress alone); the feedback's ``link`` is the
    asking tenant's: what it told and the nodes' reading of its route, never the other's."""
    from prfaas.pool.tenant_links import LinkReading

    shape = PoolShape((GroupShape("g", "m", 1),), 1e9, (TenantShare("a"), TenantShare("b")))
    door = FrontDoor(shape, epoch=3, lease_s=30.0, fingerprints={})
    keys = TenantKeys({"ka": ("a", KEY_A), "kb": ("b", KEY_B)})
    readings = {"a": LinkReading(5e9, 4e9, "measured", 1234, 0.02, 0.0, 1)}
    c = TestClient(create_app(door, keys, lambda m, n: (n / 1000, n * 100), clock=lambda: 10.0,
                              link_reading=readings.get))  # fmt: skip
    recs = [{"name": "a-d0", "host": "10.0.0.1", "transfer_port": 9000}]
    for bad, param in (({"gbps": 0}, "link.gbps"), ({"gbps": -1}, "link.gbps"),
                       ({"rtt_ms": 5}, "link.gbps"), ({"gbps": 1, "rtt_ms": -1}, "link.rtt_ms"),
                       ({"gbps": 1, "mbps": 1}, "link.mbps")):  # fmt: skip
        r = _call(c, "POST", "/v1/receivers", "ka", KEY_A, {"receivers": recs, "link": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (bad, r.json())
        assert param in r.json()["error"]["message"]
    assert door.link_of("a") is None  # nothing refused was kept
    r = _call(c, "POST", "/v1/receivers", "ka", KEY_A,
              {"receivers": recs, "link": {"gbps": 40, "rtt_ms": 20}})  # fmt: skip
    assert r.status_code == 200
    recs_b = [{"name": "b-d0", "host": "10.0.0.2", "transfer_port": 9000}]
    assert _call(c, "POST", "/v1/receivers", "kb", KEY_B, {"receivers": recs_b}).status_code == 200
    link_a = _call(c, "GET", "/v1/feedback", "ka", KEY_A).json()["link"]
    assert (link_a["gbps"], link_a["rtt_ms"]) == (40, 20)
    assert link_a["reading"] == {"pace_gbps": 40.0, "capacity_gbps": 32.0, "basis": "measured",
                                 "backlog_bytes": 1234, "rtt_s": 0.02, "retransmit_rate": 0.0,
                                 "num_senders": 1}  # fmt: skip
    link_b = _call(c, "GET", "/v1/feedback", "kb", KEY_B).json()["link"]
    assert link_b == {"gbps": None, "rtt_ms": None, "reading": None}  # b told none; a's not shown
    assert door.tenant_links() == (("a", 40e9 / 8),)


def test_wall_clock_figures_in_a_timed_pool() -> None:
    """At ``time_scale`` 0.1 the door runs on modelled seconds (10 per wall second): HTTP's
    ``Retry-After`` is whole wall seconds, rounded up, and the heartbeat's ``lease_s`` is the
    file's wall lease (a tenant renews by its own clock); the JSON hint stays on the door's
    clock."""
    shape = PoolShape((GroupShape("g", "m", 1),), 1e9, (TenantShare("a", max_queued_tokens=5000),))
    door = FrontDoor(shape, epoch=3, lease_s=30.0, fingerprints={"m": {"block_tokens": "512"}})
    keys = TenantKeys({"ka": ("a", KEY_A)})
    app = create_app(door, keys, lambda model, n: (n / 1000, n * 100), clock=lambda: 10.0,
                     wall_s_per_modelled_s=0.1)  # fmt: skip
    c = TestClient(app)
    recs = {"receivers": [{"name": "a-d0", "host": "10.0.0.1", "transfer_port": 9000}]}
    assert _call(c, "POST", "/v1/receivers", "ka", KEY_A, recs).status_code == 200
    assert _call(c, "POST", "/v1/heartbeat", "ka", KEY_A).json()["lease_s"] == pytest.approx(3.0)
    for i in range(5):
        assert _call(c, "POST", "/v1/submit", "ka", KEY_A, _sub("a", f"r{i}", "a-d0")).is_success
    over = _call(c, "POST", "/v1/submit", "ka", KEY_A, _sub("a", "r9", "a-d0"))
    hint_s = over.json()["retry_after_s"]
    assert over.status_code == 429 and hint_s > 0
    assert over.headers["retry-after"] == str(max(1, math.ceil(hint_s * 0.1)))
