"""policy.PoolAdmission: idempotent submits, refusals with reasons and retry hints, the weighted
dominant-resource order, VTC lifting, floors, the one-tenant case; waterfill; the coordination
rule's use of the pool's share."""

from __future__ import annotations

import math

import pytest

from prfaas.perf import cost_model_for
from prfaas.policy.pool_admission import (
    Accepted,
    EgressState,
    PoolAdmission,
    PrefillJob,
    Refused,
)
from prfaas.policy.pool_coordination import PoolCapacity, TenantLoad, choose_threshold
from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare, waterfill

pytestmark = pytest.mark.timeout(60)

FREE = EgressState()


def _shape(*tenants: TenantShare, nodes: int = 2) -> PoolShape:
    return PoolShape((GroupShape("g", "m", nodes),), 1e9, tenants)


def _job(tenant: str, i: int, compute_s: float = 1.0, kv: int = 1000, tokens: int = 100):
    return PrefillJob(tenant, f"r{i}", "m", tokens, compute_s, kv)


def test_submit_is_idempotent_by_tenant_and_request_id() -> None:
    adm = PoolAdmission(_shape(TenantShare("a")))
    first = adm.submit(_job("a", 1), now=0.0)
    again = adm.submit(_job("a", 1), now=5.0)
    assert isinstance(first, Accepted) and again == first
    assert adm.feedback("a", 5.0).queued_tokens == 100  # queued once


def test_unknown_tenant_and_model_are_refused_by_name() -> None:
    adm = PoolAdmission(_shape(TenantShare("a")))
    r = adm.submit(_job("x", 1), 0.0)
    assert isinstance(r, Refused) and r.reason == "unknown_tenant" and "'x'" in r.detail
    r = adm.submit(PrefillJob("a", "r", "other", 10, 1.0, 10), 0.0)
    assert isinstance(r, Refused) and r.reason == "unknown_model" and "'other'" in r.detail
    assert r.retry_after_s is None


def test_caps_refuse_with_a_retry_hint() -> None:
    adm = PoolAdmission(_shape(TenantShare("a", max_queued_tokens=250, max_rate_rps=100.0)))
    assert isinstance(adm.submit(_job("a", 1), 0.0), Accepted)
    assert isinstance(adm.submit(_job("a", 2), 0.0), Accepted)
    r = adm.submit(_job("a", 3), 0.0)
    assert isinstance(r, Refused) and r.reason == "over_queued_tokens_cap"
    assert r.retry_after_s is not None and r.retry_after_s > 0
    slow = PoolAdmission(_shape(TenantShare("b", max_rate_rps=1.0)))
    assert isinstance(slow.submit(_job("b", 1), 0.0), Accepted)
    r = slow.submit(_job("b", 2), 0.25)
    assert isinstance(r, Refused) and r.reason == "over_rate_cap"
    assert r.retry_after_s == pytest.approx(0.75)
    assert isinstance(slow.submit(_job("b", 2), 1.0), Accepted)  # a refusal is not remembered


def test_dispatch_follows_weights() -> None:
    adm = PoolAdmission(_shape(TenantShare("a", 2.0), TenantShare("b", 1.0), nodes=1))
    for i in range(30):
        adm.submit(_job("a", i), 0.0)
        adm.submit(_job("b", i), 0.0)
    order = []
    for _ in range(30):
        job = adm.dispatch("g", 0.0, FREE)
        assert job is not None
        order.append(job.tenant)
        adm.finish(job, 0.0)
    assert order.count("a") == 20 and order.count("b") == 10


def test_dominant_cost_charges_the_byte_heavy_tenant_by_bytes() -> None:
    adm = PoolAdmission(_shape(TenantShare("a"), TenantShare("b"), nodes=1))
    heavy = PrefillJob("b", "r", "m", 10, 1.0, int(4e9))  # 4 s of egress, 1 s of compute
    assert adm.dominant_cost(heavy) == pytest.approx(4.0)
    for i in range(8):
        adm.submit(_job("a", i), 0.0)
        adm.submit(PrefillJob("b", f"r{i}", "m", 10, 1.0, int(4e9)), 0.0)
    order = []
    for _ in range(10):
        job = adm.dispatch("g", 0.0, FREE)
        assert job is not None
        order.append(job.tenant)
        adm.finish(job, 0.0)
    assert order.count("a") == 8  # a's counter rises by 1 per prefill, b's by 4


def test_returning_tenant_is_lifted_not_owed_its_idle_time() -> None:
    adm = PoolAdmission(_shape(TenantShare("a"), TenantShare("b"), nodes=1))
    for i in range(50):
        adm.submit(_job("a", i), 0.0)
    for _ in range(40):
        job = adm.dispatch("g", 0.0, FREE)
        assert job is not None
        adm.finish(job, 0.0)
    adm.submit(_job("b", 1), 10.0)
    assert adm.counter_of("b") == pytest.approx(adm.counter_of("a"))
    seen = []
    for _ in range(4):
        job = adm.dispatch("g", 10.0, FREE)
        assert job is not None
        seen.append(job.tenant)
        adm.finish(job, 10.0)
    assert seen.count("b") == 1  # served promptly, but not 40 prefills in a row


def test_floor_serves_its_tenant_first_and_is_work_conserving() -> None:
    shape = PoolShape(
        (GroupShape("g", "m", 2),),
        1e9,
        (TenantShare("a", 10.0), TenantShare("b", floor_nodes=(("g", 1),))),
    )
    adm = PoolAdmission(shape)
    for i in range(5):
        adm.submit(_job("a", i), 0.0)
    first = adm.dispatch("g", 0.0, FREE)
    second = adm.dispatch("g", 0.0, FREE)
    assert first is not None and second is not None  # b idle: its floor node serves a
    assert {first.tenant, second.tenant} == {"a"}
    adm.finish(first, 1.0)
    adm.submit(_job("b", 1), 1.0)
    nxt = adm.dispatch("g", 1.0, FREE)
    assert nxt is not None and nxt.tenant == "b"


def test_egress_full_holds_only_the_tenants_over_their_part() -> None:
    adm = PoolAdmission(_shape(TenantShare("a"), TenantShare("b")))
    adm.submit(_job("a", 1), 0.0)
    adm.submit(_job("b", 1), 0.0)
    full = EgressState(2e9, (("a", 0.0), ("b", 2e9)))
    job = adm.dispatch("g", 0.0, full)
    assert job is not None and job.tenant == "a"
    assert adm.dispatch("g", 0.0, full) is None  # b holds the whole egress window
    assert adm.dispatch("g", 0.0, EgressState(0.0, (("b", 5e9),), (("b", 1e9),))) is None


def test_one_tenant_case_is_the_same_object() -> None:
    adm = PoolAdmission(PoolShape.one_tenant("paper-1t", 4, 12.5e9))
    d = adm.submit(PrefillJob("local", "r1", "paper-1t", 20000, 1.0, 10**9), 0.0)
    assert isinstance(d, Accepted) and d.expected_start_s == 0.0
    assert adm.feedback("local", 0.0).attainable_share == pytest.approx(1.0)


def test_shape_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="weight must be > 0"):
        TenantShare("a", weight=0.0)
    with pytest.raises(ValueError, match="duplicate name 'a'"):
        _shape(TenantShare("a"), TenantShare("a"))


def test_waterfill_gives_unused_share_to_others() -> None:
    alloc = waterfill({"a": 2.0, "b": 1.0}, {"a": 0.2, "b": math.inf})
    assert alloc == pytest.approx({"a": 0.2, "b": 0.8})
    alloc = waterfill({"a": 2.0, "b": 1.0}, {"a": math.inf, "b": math.inf})
    assert alloc == pytest.approx({"a": 2 / 3, "b": 1 / 3})


def test_coordinated_threshold_offloads_less_with_a_smaller_share() -> None:
    pool_cost, local_cost = cost_model_for("paper-1t", "h200"), cost_model_for("paper-1t", "h20")
    lengths = tuple(range(1000, 100_000, 500))
    load = TenantLoad(lengths, 2.0, 3, 12.5e9)
    whole = choose_threshold(load, PoolCapacity(4, 12.5e9, 1.0), local_cost, pool_cost)
    third = choose_threshold(load, PoolCapacity(4, 12.5e9, 1 / 3), local_cost, pool_cost)
    queued = choose_threshold(load, PoolCapacity(4, 12.5e9, 1.0, 60.0), local_cost, pool_cost)
    slow = TenantLoad(lengths, 2.0, 3, 0.2e9)  # its own link is the limit
    link = choose_threshold(slow, PoolCapacity(4, 12.5e9, 1.0), local_cost, pool_cost)
    backlog = PoolCapacity(4, 12.5e9, 1.0, link_backlog_s=30.0)
    held = choose_threshold(slow, backlog, local_cost, pool_cost)
    assert third.threshold_tokens > whole.threshold_tokens
    assert queued.threshold_tokens > whole.threshold_tokens
    assert link.threshold_tokens > whole.threshold_tokens
    assert held.threshold_tokens > link.threshold_tokens


def test_pool_session_falls_back_on_epoch_change_silence_and_refusal() -> None:
    from prfaas.policy.pool_session import PoolSession

    s = PoolSession(silence_s=1.5)
    assert not s.usable(0.0)
    assert s.heard(1, 0.0) == ()
    s.submitted("r1", 0.1)
    s.submitted("r2", 0.2)
    s.started("r1")  # its KV streams from the node: left to finish
    assert s.tick(1.0) == ()
    assert [(f.request_id, f.reason) for f in s.heard(2, 1.2)] == [("r2", "epoch_changed")]
    s.submitted("r3", 1.3)
    assert [f.reason for f in s.tick(3.0)] == ["pool_silent"]
    assert not s.usable(3.0)
    assert s.refused("r4", "over_rate_cap").reason == "refused:over_rate_cap"
    assert s.unreachable("r5").reason == "pool_unreachable"
    assert dict(s.fallbacks) == {
        "epoch_changed": 1,
        "pool_silent": 1,
        "refused:over_rate_cap": 1,
        "pool_unreachable": 1,
    }


def test_a_tenant_added_at_run_time_starts_at_the_least_active_counter() -> None:
    adm = PoolAdmission(_shape(TenantShare("a"), TenantShare("b"), nodes=1))
    for i in range(4):
        adm.submit(_job("a", i), 0.0)
        adm.submit(_job("b", i), 0.0)
    for t in (1.0, 2.0):  # one of a's and one of b's start: both counters rise
        job = adm.dispatch("g", t, FREE)
        assert job is not None
        adm.finish(job, t + 0.5)
    low = min(adm.counter_of("a"), adm.counter_of("b"))
    assert low > 0
    adm.set_tenant(TenantShare("c", weight=2.0), 3.0)
    assert adm.counter_of("c") == low  # owed nothing for the time before it joined
    assert isinstance(adm.submit(_job("c", 1), 3.0), Accepted)
    assert "c" in adm.tenants() and adm.shape.tenants[-1].weight == 2.0
    # A known tenant's new cap applies to its next submit.
    adm.set_tenant(TenantShare("a", max_queued_tokens=150), 3.0)
    r = adm.submit(_job("a", 9), 3.0)
    assert isinstance(r, Refused) and r.reason == "over_queued_tokens_cap"


def test_a_handed_back_prefill_keeps_its_place_and_is_charged_once() -> None:
    """A prefill a noticed node gave back goes to the front of its tenant's queue (before what
    was submitted after it), its tenant's counter is refunded its start's charge (a weight change
    meanwhile does not change the refund), and it is charged again when it starts anew."""
    adm = PoolAdmission(_shape(TenantShare("a", 2.0), TenantShare("b"), nodes=1))
    for i in range(3):
        adm.submit(_job("a", i, tokens=100), 0.0)
    adm.submit(_job("b", 9), 0.0)
    before = adm.counter_of("a")
    first = adm.dispatch("g", 1.0, FREE)
    assert first is not None and first.request_id == "r0"
    charged = adm.counter_of("a") - before
    assert charged > 0
    adm.set_tenant(TenantShare("a", 4.0), 1.5)  # a reload between the start and the return
    adm.requeue(first, 2.0)
    assert adm.counter_of("a") == pytest.approx(before)  # refunded exactly what it paid
    fb = adm.feedback("a", 2.0)
    assert fb.running == 0 and fb.queued_tokens == 300
    again = adm.dispatch("g", 2.0, FREE)
    assert again is not None and again.request_id == "r0"  # its place: the front
    assert adm.counter_of("a") == pytest.approx(before + charged / 2)  # at the new weight
    adm.finish(again, 3.0)
    order = []
    while (job := adm.dispatch("g", 3.0, FREE)) is not None:
        order.append(job.request_id)
        adm.finish(job, 3.0)
    assert order[:1] == ["r9"] and sorted(order) == ["r1", "r2", "r9"]  # b's turn came
    assert adm.feedback("a", 4.0).queued_tokens == 0


def test_a_computed_prefill_frees_its_node_once_and_keeps_its_charge_to_the_end() -> None:
    """``computed``: the node is free for the next prefill (the floor and ``running`` follow)
    while the first one has not ended; its ``finish`` or ``requeue`` later frees nothing more
    (another running prefill of the tenant is still counted), and a requeue still refunds it."""
    shape = PoolShape((GroupShape("g", "m", 1),), 1e9, (TenantShare("a", floor_nodes=(("g", 1),)),))
    adm = PoolAdmission(shape)
    for i in range(3):
        adm.submit(_job("a", i), 0.0)
    first = adm.dispatch("g", 0.0, FREE)
    assert first is not None and adm.feedback("a", 0.0).running == 1
    charged = adm.counter_of("a")
    adm.computed(first, 1.0)
    adm.computed(first, 1.0)  # said twice: freed once
    assert adm.feedback("a", 1.0).running == 0
    second = adm.dispatch("g", 1.0, FREE)
    assert second is not None and adm.feedback("a", 1.0).running == 1
    adm.finish(first, 2.0)  # verified at last: the second still holds the node
    assert adm.feedback("a", 2.0).running == 1
    adm.computed(second, 2.5)
    adm.requeue(second, 3.0)  # a notice after its compute: back at the front, refunded
    assert adm.feedback("a", 3.0).running == 0
    assert adm.counter_of("a") == pytest.approx(charged)
    again = adm.dispatch("g", 3.0, FREE)
    assert again is not None and again.request_id == "r1"
    adm.computed(PrefillJob("a", "r9", "m", 1, 1.0, 1), 3.0)  # never started: nothing
    assert adm.feedback("a", 3.0).running == 1


def _placed(adm: PoolAdmission, tenant: str, expected_s: float, now: float = 0.0) -> PrefillJob:
    """``tenant``'s next prefill, started on a node expected to compute ``expected_s``."""
    job = adm.dispatch("g", now, FREE, lambda j: expected_s)
    assert job is not None and job.tenant == tenant
    return job


@pytest.mark.parametrize(
    ("real_s", "sign"),
    [(0.5, -1), (2.5, 1), (1.5, 0)],
    ids=["found_more_refunded", "found_less_surcharged", "found_as_expected"],
)
def test_a_done_prefill_is_charged_what_its_node_really_computed(real_s: float, sign: int) -> None:
    """The start charged the node's expected compute (1.5 s on 2 nodes: 0.75); the outcome's real
    compute trues the counter up by exactly the difference of the two charges, at the weight of
    the start (a reload to 4 meanwhile changes nothing): a node that found more of the prompt
    refunds, less surcharges, as expected changes nothing."""
    adm = PoolAdmission(_shape(TenantShare("a", 2.0)))
    adm.submit(_job("a", 1), 0.0)
    job = _placed(adm, "a", 1.5)
    assert adm.counter_of("a") == pytest.approx(1.5 / 2 / 2)
    adm.set_tenant(TenantShare("a", 4.0), 0.5)
    delta = adm.finish(job, 1.0, compute_s=real_s)
    assert delta == pytest.approx((real_s - 1.5) / 2 / 2)
    assert math.copysign(1, delta) == sign or (sign == 0 and delta == 0.0)
    assert adm.counter_of("a") == pytest.approx(real_s / 2 / 2)  # as if charged so at its start
    assert adm.finish(job, 2.0, compute_s=0.1) == 0.0  # ended: nothing more to correct
    assert adm.counter_of("a") == pytest.approx(real_s / 2 / 2)


def test_a_failed_or_handed_back_prefill_is_not_corrected_twice() -> None:
    """A failed prefill keeps its start's charge (``finish`` without ``compute_s``); a requeue
    refunds the whole start (its outcome's true-up, if one comes late, finds nothing held), and
    its new start is trued up once."""
    adm = PoolAdmission(_shape(TenantShare("a")))
    adm.submit(_job("a", 1), 0.0)
    adm.submit(_job("a", 2), 0.0)
    failed = _placed(adm, "a", 1.0)
    assert adm.finish(failed, 1.0) == 0.0
    assert adm.counter_of("a") == pytest.approx(0.5)  # kept
    back = _placed(adm, "a", 1.0, 1.0)
    adm.requeue(back, 2.0)
    assert adm.counter_of("a") == pytest.approx(0.5)  # refunded its whole start
    assert adm.finish(back, 2.0, compute_s=0.2) == 0.0  # a late outcome: nothing held
    assert adm.counter_of("a") == pytest.approx(0.5)
    again = _placed(adm, "a", 1.0, 3.0)
    assert adm.finish(again, 4.0, compute_s=0.2) == pytest.approx(-0.4)
    assert adm.counter_of("a") == pytest.approx(0.5 + 0.1)


def _lifted(real_s: float | None) -> PoolAdmission:
    """a's prefill (expected 2.0 s on 2 nodes: a's counter 1.0) is computed: its node is free,
    its KV on its way, a idle. b starts one of 10.0 s (b's counter 5.0); a comes back and is
    lifted to 5.0 (VTC), and its next prefill starts (0.5 more). Then the first one's outcome:
    done in ``real_s`` (None: handed back instead)."""
    adm = PoolAdmission(_shape(TenantShare("a"), TenantShare("b")))
    adm.submit(_job("a", 1), 0.0)
    first = _placed(adm, "a", 2.0)
    adm.computed(first, 1.0)
    adm.submit(_job("b", 1), 1.0)
    _placed(adm, "b", 10.0, 1.0)
    adm.submit(_job("a", 2), 2.0)
    assert adm.counter_of("a") == pytest.approx(5.0)  # lifted from 1.0
    _placed(adm, "a", 1.0, 2.0)
    if real_s is None:
        adm.requeue(first, 3.0)
    else:
        adm.finish(first, 3.0, compute_s=real_s)
    return adm


@pytest.mark.parametrize("real_s", [0.0, 4.0, 14.0])
def test_a_true_up_after_a_lift_is_as_if_made_at_the_start(real_s: float) -> None:
    """The counter is what it would be had the start been charged the real compute: max(1.0 +
    the correction, the lift's 5.0) + the later start's 0.5. A refund does not take a below its
    lift (the lift already forgave more), a surcharge the lift's gap covers adds nothing, a
    larger one what is left (real 14: 1.0 + 6.0 = 7.0 > 5.0)."""
    adm = _lifted(real_s)
    assert adm.counter_of("a") == pytest.approx(max(1.0 + (real_s - 2.0) / 2, 5.0) + 0.5)


def test_a_requeue_after_a_lift_refunds_nothing_the_lift_gave() -> None:
    """A handed-back prefill's refund is the same correction (to nothing): after a lift that
    already covered it, the counter stays where the lift and the later start put it."""
    assert _lifted(None).counter_of("a") == pytest.approx(5.5)
