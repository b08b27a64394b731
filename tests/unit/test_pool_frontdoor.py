"""pool.FrontDoor: isolation (a tenant submits only as itself, only to receivers it registered,
reads only its own outcomes), leases and epochs, fingerprints, revocation, placement through the
shared admission object; a prefill handed back by a noticed node queued again, within bounds."""

from __future__ import annotations

import pytest

from prfaas.policy.pool_admission import Accepted, EgressState, Refused
from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.pool import FrontDoor, Receiver, Submit
from prfaas.pool.frontdoor import MAX_HAND_BACKS

pytestmark = pytest.mark.timeout(60)

FP = {"config": "c1", "weights_digest": "w1", "dtype": "bf16", "block_tokens": "512",
      "cache_layout": "l1"}  # fmt: skip
FREE = EgressState()


def _door() -> FrontDoor:
    shape = PoolShape((GroupShape("g", "m", 1),), 1e9, (TenantShare("a"), TenantShare("b")))
    door = FrontDoor(shape, epoch=7, lease_s=3.0, fingerprints={"m": FP})
    door.register("a", (Receiver("a-d0", "10.0.0.1", 9000),), now=0.0)
    door.register("b", (Receiver("b-d0", "10.0.1.1", 9000),), now=0.0)
    return door


def _submit(tenant: str, rid: str, receiver: str, fp: dict[str, str] | None = None) -> Submit:
    return Submit(tenant, rid, "m", tuple(sorted((fp or FP).items())), 1000, receiver, "s1",
                  1.0, 10**6)  # fmt: skip


def test_accepts_with_epoch_and_places_to_the_registered_receiver() -> None:
    door = _door()
    ans = door.submit("a", _submit("a", "r1", "a-d0"), now=1.0)
    assert ans.status == 200 and ans.epoch == 7 and isinstance(ans.decision, Accepted)
    assert door.outcome("a", "r1").state == "queued"  # type: ignore[union-attr]
    placed = door.place("g", "pool-0", 1.0, FREE)
    assert placed is not None and placed.receiver.host == "10.0.0.1" and placed.session == "s1"
    assert door.outcome("a", "r1").state == "running"  # type: ignore[union-attr]
    door.finished("a", "r1", 2.0)
    assert door.outcome("a", "r1").state == "done"  # type: ignore[union-attr]


def test_a_tenant_cannot_act_as_or_reach_the_other() -> None:
    door = _door()
    as_b = door.submit("a", _submit("b", "r1", "b-d0"), now=1.0)
    assert as_b.status == 403 and isinstance(as_b.decision, Refused)
    assert as_b.decision.reason == "wrong_tenant"
    to_b = door.submit("a", _submit("a", "r2", "b-d0"), now=1.0)
    assert to_b.status == 403 and to_b.decision.reason == "receiver_not_registered"  # type: ignore[union-attr]
    door.submit("b", _submit("b", "r9", "b-d0"), now=1.0)
    assert door.outcome("a", "r9") is None  # b's request is invisible to a
    assert door.place("g", "pool-0", 1.0, FREE) is not None  # nothing of a's was queued


def test_fingerprint_mismatch_names_the_field() -> None:
    door = _door()
    ans = door.submit("a", _submit("a", "r1", "a-d0", {**FP, "block_tokens": "256"}), now=1.0)
    assert ans.status == 409 and "fingerprint.block_tokens" in ans.decision.detail  # type: ignore[union-attr]


def test_lease_expiry_drops_queued_and_aborts_running() -> None:
    door = _door()
    door.submit("a", _submit("a", "r1", "a-d0"), now=1.0)
    door.submit("a", _submit("a", "r2", "a-d0"), now=1.0)
    door.place("g", "pool-0", 1.5, FREE)
    door.heartbeat("b", 2.5)
    assert door.expire(3.0) == ()  # a registered at 0 with a 3 s lease
    got = door.expire(3.1)
    assert {(a.request_id, a.reason, a.node) for a in got} == {
        ("r1", "lease_expired", "pool-0"),
        ("r2", "lease_expired", None),
    }
    assert door.expire(3.2) == ()  # once
    assert door.outcome("a", "r2").state == "aborted"  # type: ignore[union-attr]
    after = door.submit("a", _submit("a", "r3", "a-d0"), now=3.2)
    assert after.status == 403 and after.decision.reason == "no_lease"  # type: ignore[union-attr]
    door.heartbeat("a", 3.3)
    again = door.submit("a", _submit("a", "r2", "a-d0"), now=3.4)
    assert again.status == 200  # a dropped id may be submitted anew


def test_revoked_tenant_is_refused_and_its_work_aborted() -> None:
    door = _door()
    door.submit("b", _submit("b", "r1", "b-d0"), now=1.0)
    placed = door.place("g", "pool-0", 1.0, FREE)
    assert placed is not None
    aborts = door.revoke("b", 1.5)
    assert [(a.request_id, a.reason, a.node) for a in aborts] == [("r1", "revoked", "pool-0")]
    ans = door.submit("b", _submit("b", "r2", "b-d0"), now=1.6)
    assert ans.status == 403 and ans.decision.reason == "revoked"  # type: ignore[union-attr]
    door.finished("b", "r1", 2.0)  # the node's late answer changes nothing
    assert door.outcome("b", "r1").reason == "revoked"  # type: ignore[union-attr]


def test_a_tenant_aborts_its_own_queued_or_running_prefill_only() -> None:
    door = _door()
    for rid in ("r1", "r2"):
        door.submit("a", _submit("a", rid, "a-d0"), now=1.0)
    assert door.abort("b", "r1", 1.0) is None  # another tenant's reads as unknown
    placed = door.place("g", "pool-0", 1.0, FREE)
    assert placed is not None and placed.job.request_id == "r1"
    running = door.abort("a", "r1", 1.5)  # running: to be stopped at its node
    assert running is not None and running.node == "pool-0" and running.reason == "client_gone"
    queued = door.abort("a", "r2", 1.5)  # queued: dropped, no node to tell
    assert queued is not None and queued.node is None
    for rid in ("r1", "r2"):
        out = door.outcome("a", rid)
        assert out is not None and (out.state, out.reason) == ("aborted", "client_gone")
    assert door.abort("a", "r2", 1.6) is None  # once
    door.finished("a", "r1", 2.0)  # the node's late answer changes nothing
    assert door.outcome("a", "r1").state == "aborted"  # type: ignore[union-attr]
    assert door.place("g", "pool-0", 2.0, FREE) is None  # r2 left the queue
    assert door.feedback("a", 2.0).queued_tokens == 0 and door.feedback("a", 2.0).running == 0


def test_a_reload_revokes_the_tenant_left_without_keys_adds_a_new_one_and_restores() -> None:
    door = _door()
    door.submit("b", _submit("b", "r1", "b-d0"), now=1.0)
    assert door.place("g", "pool-0", 1.0, FREE) is not None
    door.submit("b", _submit("b", "r2", "b-d0"), now=1.0)  # queued behind r1
    aborts = door.set_tenants((TenantShare("a", weight=3.0), TenantShare("c")), now=2.0)
    assert sorted((a.request_id, a.reason, a.node) for a in aborts) == [
        ("r1", "revoked", "pool-0"), ("r2", "revoked", None)]  # fmt: skip
    assert door.revoked("b") and not door.revoked("a") and not door.revoked("c")
    assert door.outcome("b", "r2").reason == "revoked"  # type: ignore[union-attr]
    assert {t.name: t.weight for t in door.shape.tenants}["a"] == 3.0
    # The new tenant registers and submits like any other.
    door.register("c", (Receiver("c-d0", "10.0.2.1", 9000),), now=2.0)
    ans = door.submit("c", _submit("c", "r1", "c-d0"), now=2.1)
    assert ans.status == 200, ans
    # A reload that lists b again restores it; it has no lease until it registers afresh.
    assert door.set_tenants((TenantShare("a"), TenantShare("b"), TenantShare("c")), 3.0) == ()
    ans = door.submit("b", _submit("b", "r3", "b-d0"), now=3.1)
    assert ans.status == 403 and ans.decision.reason == "no_lease"  # type: ignore[union-attr]
    door.register("b", (Receiver("b-d0", "10.0.1.1", 9000),), now=3.2)
    assert door.submit("b", _submit("b", "r3", "b-d0"), now=3.3).status == 200


def test_a_handed_back_prefill_is_queued_again_for_the_same_receiver_and_session() -> None:
    door = _door()
    for rid in ("r1", "r2"):
        door.submit("a", _submit("a", rid, "a-d0"), now=1.0)
    first = door.place("g", "pool-0", 1.0, FREE)
    assert first is not None and first.job.request_id == "r1"
    out = door.requeue("a", "r1", 2.0, "pool-0 got a notice")
    assert out is not None and (out.state, out.reason) == ("queued", "handed_back")
    assert door.outcome("a", "r1") == out  # the tenant's outcome: still pending
    again = door.place("g", "pool-1", 2.0, FREE)  # the front of a's queue: before r2
    assert again is not None and again.job.request_id == "r1" and again.node == "pool-1"
    assert (again.receiver, again.session) == (first.receiver, first.session)
    door.finished("a", "r1", 3.0)
    assert door.outcome("a", "r1").state == "done"  # type: ignore[union-attr]
    assert door.requeue("a", "r1", 3.0) is None  # ended: nothing to queue again
    assert door.requeue("b", "r2", 3.0) is None  # another tenant's (and queued, not running)


def test_a_prefill_handed_back_too_often_fails_with_the_reason() -> None:
    door = _door()
    door.submit("a", _submit("a", "r1", "a-d0"), now=1.0)
    for i in range(MAX_HAND_BACKS):
        assert door.place("g", f"pool-{i}", 1.0 + i, FREE) is not None
        out = door.requeue("a", "r1", 1.5 + i, f"pool-{i} got a notice")
        assert out is not None and out.state == "queued"
    assert door.place("g", "pool-9", 9.0, FREE) is not None
    out = door.requeue("a", "r1", 9.5, "pool-9 got a notice")
    assert out is not None and out.state == "failed"
    assert out.reason.startswith("handed_back:") and "pool-9 got a notice" in out.reason
    assert door.place("g", "pool-0", 10.0, FREE) is None  # not queued again
    fb = door.feedback("a", 10.0)
    assert fb.queued_tokens == 0 and fb.running == 0


def test_a_handed_back_prefill_can_still_be_aborted_or_expire() -> None:
    door = _door()
    for rid in ("r1", "r2"):
        door.submit("a", _submit("a", rid, "a-d0"), now=1.0)
    door.place("g", "pool-0", 1.0, FREE)
    door.requeue("a", "r1", 1.5)
    gone = door.abort("a", "r1", 1.6)  # queued again: dropped, no node to tell
    assert gone is not None and gone.node is None
    door.place("g", "pool-0", 1.7, FREE)  # r2
    assert door.abort("a", "r2", 1.8) is not None  # the tenant gave up while it ran ...
    assert door.requeue("a", "r2", 1.9) is None  # ... so the node's hand-back changes nothing
    assert door.outcome("a", "r2").state == "aborted"  # type: ignore[union-attr]
    door.submit("a", _submit("a", "r3", "a-d0"), now=2.0)
    door.place("g", "pool-0", 2.0, FREE)
    door.requeue("a", "r3", 2.1)
    got = door.expire(3.1)  # a registered at 0 with a 3 s lease: the requeued one is dropped
    assert [(a.request_id, a.node) for a in got] == [("r3", None)]
