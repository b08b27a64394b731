"""The pool simulator's prefix stores, as a live pool's nodes keep them (``sim/pool_prefixes.py``,
``docs/pool.md`` *Prefixes*): a tenant's repeated prefix hits at the pool node and its prefill is
charged and run for the tokens after it; two tenants' equal prompts do not hit each other's
prefixes unless the pool shares them; a flooding tenant evicts only its own entries while the
other holds no more than its quota; a prefill goes to the free node holding its prefix. Prompts
are a trace's (arrival, tokens) with block hashes. Counts and charges only, never wall time."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from prfaas.perf import cost_model_for
from prfaas.policy.pool_admission import prefill_node_s
from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.sim.kv_bytes import KvBytes
from prfaas.sim.pool_report import pool_summary
from prfaas.sim.pool_scenario import PoolSimGroup, PoolSimScenario, PoolSimTenant
from prfaas.sim.pool_sim import PoolSimulator
from prfaas.workload import ArrivalSpec, FixedLengths

pytestmark = pytest.mark.timeout(60)

H200 = cost_model_for("paper-1t", "h200")
H20 = cost_model_for("paper-1t", "h20")
BLOCK = 512
PREFIX = 16 * BLOCK  # one checkpoint (every 16 blocks, and the last full block)
TOKENS = PREFIX + 100
CHECKPOINT_BYTES = KvBytes(H200.model.cache).total(PREFIX)
EGRESS = 1e15  # compute is every prefill's dominant cost: the charge is its node-seconds

Prompt = tuple[float, tuple[int, ...]]


def _prompt(at_s: float, prefix: int, suffix: int) -> Prompt:
    """A prompt of ``TOKENS`` at ``at_s``: 16 blocks named by ``prefix``, then one of its own."""
    return at_s, (*range(prefix * 100, prefix * 100 + 16), 10**6 + suffix)


def _tenant(name: str, prompts: Sequence[Prompt]) -> PoolSimTenant:
    return PoolSimTenant(
        name, "paper-1t", ArrivalSpec("poisson", 1.0), FixedLengths(TOKENS), 1, H20, 100e9 / 8,
        threshold_tokens=0, tuner="fixed",  # everything offloaded
        trace=tuple((at, TOKENS) for at, _ in prompts),
        trace_block_hashes=tuple(h for _, h in prompts),
    )  # fmt: skip


def _run(
    tenants: dict[str, Sequence[Prompt]],
    *,
    num_nodes: int = 1,
    per_node_stores: bool = False,
    share_prefixes: bool = False,
    store_bytes: int | None = None,
) -> PoolSimulator:
    shape = PoolShape(
        (GroupShape("g", "paper-1t", num_nodes),), EGRESS, tuple(TenantShare(t) for t in tenants)
    )
    group = PoolSimGroup("g", "paper-1t", num_nodes, H200, per_node_stores=per_node_stores,
                         prefix_store_bytes=store_bytes)  # fmt: skip
    sc = PoolSimScenario(
        shape, (group,), tuple(_tenant(n, p) for n, p in tenants.items()), duration_s=2000.0,
        share_prefixes=share_prefixes,
    )  # fmt: skip
    sim = PoolSimulator(sc)
    sim.run()
    for run in sim.tenants.values():
        assert run.num_completed == run.num_arrived == run.num_offloaded
    return sim


def test_a_tenants_repeated_prefix_hits_and_its_charge_drops() -> None:
    prompts = [_prompt(0.0, 1, 1), _prompt(30.0, 1, 2), _prompt(60.0, 1, 3)]
    sim = _run({"a": prompts})
    run = sim.tenants["a"]
    assert run.pool_hit_tokens == 2 * PREFIX  # the second and third find the first's prefix
    assert run.pool_lookup_tokens == 3 * TOKENS
    full = prefill_node_s(H200, TOKENS)
    hit = prefill_node_s(H200, TOKENS - PREFIX, PREFIX)
    assert hit < full
    # Charged (one node, compute dominant, weight 1) and run for what the node computed.
    assert sim.admission.counter_of("a") == pytest.approx(full + 2 * hit)
    assert run.compute_s_in_window["g"] == pytest.approx(full + 2 * hit)
    out = pool_summary(sim)["tenants"]["a"]["pool_prefixes"]
    assert out["hit_tokens"] == 2 * PREFIX and out["lookup_tokens"] == 3 * TOKENS


def test_the_simulators_prefills_end_as_the_live_doors_with_a_zero_true_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each simulated pool prefill ends by the live door's ``settle_cached``, with what its node
    really found; the simulator's hints are its stores read at the node's own lookup, so the
    expectation is the truth and no charge is corrected, hits or not."""
    import prfaas.sim.pool_sim as pool_sim

    ends: list[tuple[int, int | None, float]] = []
    settle = pool_sim.settle_cached

    def spy(adm, job, now, placed, found, hints):  # type: ignore[no-untyped-def]
        delta = settle(adm, job, now, placed, found, hints)
        ends.append((placed.pick.cached_tokens, found, delta))
        return delta

    monkeypatch.setattr(pool_sim, "settle_cached", spy)
    _run({"a": [_prompt(0.0, 1, 1), _prompt(30.0, 1, 2), _prompt(60.0, 1, 3)]})
    assert ends == [(0, 0, 0.0), (PREFIX, PREFIX, 0.0), (PREFIX, PREFIX, 0.0)]


def test_without_hashes_nothing_hits_and_the_charge_is_the_submitted_one() -> None:
    sim = _run({"a": [_prompt(0.0, 1, 1), _prompt(30.0, 2, 2)]})  # two different prefixes
    assert sim.tenants["a"].pool_hit_tokens == 0
    assert sim.admission.counter_of("a") == pytest.approx(2 * prefill_node_s(H200, TOKENS))


@pytest.mark.parametrize("shared", [False, True])
def test_two_tenants_same_tokens_hit_each_other_only_when_shared(shared: bool) -> None:
    sim = _run({"a": [_prompt(0.0, 1, 1)], "b": [_prompt(30.0, 1, 1)]}, share_prefixes=shared)
    assert sim.tenants["a"].pool_hit_tokens == 0
    assert sim.tenants["b"].pool_hit_tokens == (PREFIX if shared else 0)
    names = {u.namespace for u in sim.prefixes.node_stores("g")["g-0"].usage() if u.num_entries}
    assert names == ({""} if shared else {"a", "b"})


@pytest.mark.parametrize("shared", [False, True])
def test_a_flooding_tenant_evicts_inside_its_own_quota(shared: bool) -> None:
    # Six checkpoints fit; equal weights: three each. a stores two prefixes, then b floods with
    # twelve distinct ones; a comes back to both.
    a = [_prompt(0.0, 1, 1), _prompt(30.0, 2, 2), _prompt(1000.0, 1, 3), _prompt(1030.0, 2, 4)]
    b = [_prompt(60.0 + 30 * i, 10 + i, i) for i in range(12)]
    sim = _run({"a": a, "b": b}, store_bytes=6 * CHECKPOINT_BYTES, share_prefixes=shared)
    store = sim.prefixes.node_stores("g")["g-0"]
    assert store.used_bytes <= store.capacity_bytes
    if shared:  # one namespace, no quotas: b's flood took a's prefixes
        assert sim.tenants["a"].pool_hit_tokens == 0
        return
    assert sim.tenants["a"].pool_hit_tokens == 2 * PREFIX  # both survived b's flood
    usage = {u.namespace: u for u in store.usage()}
    assert usage["a"].quota_bytes == usage["b"].quota_bytes == 3 * CHECKPOINT_BYTES
    assert usage["a"].num_entries == 2  # its two (its return found them: nothing new to store)
    assert usage["b"].num_entries == 4  # the rest of the store: b's flood evicted b's own
    assert usage["b"].num_hit_tokens == 0


def test_a_prefill_goes_to_the_free_node_holding_its_prefix() -> None:
    # The first two run at once on g-0 and g-1; the third, with g-1's prefix, finds both free.
    prompts = [_prompt(0.0, 1, 1), _prompt(0.001, 2, 2), _prompt(30.0, 2, 3)]
    sim = _run({"a": prompts}, num_nodes=2, per_node_stores=True)
    stores = sim.prefixes.node_stores("g")
    assert stores["g-0"] is not stores["g-1"]
    assert sim.tenants["a"].pool_hit_tokens == PREFIX
    assert stores["g-1"].num_hit_tokens == PREFIX and stores["g-0"].num_hit_tokens == 0
    assert stores["g-1"].num_lookups == 2 and stores["g-0"].num_lookups == 1
