"""Nodes of one site that share cores (``SimSite.shared_cores``, from ``engine.cpus``): while
their demand exceeds the cores, each runs at ``cores / demand`` of its own speed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prfaas.sim import SimScenario, SimSite, Simulator
from prfaas.sim.processor import SharedCores
from prfaas.workload import SimRequestSpec


def test_the_slowdown_is_demand_over_cores_once_it_exceeds_them() -> None:
    cores = SharedCores(2, threads_per_node=1)
    assert [cores.slowdown() for cores.busy in (0, 1, 2, 3, 4)] == [1.0, 1.0, 1.0, 1.5, 2.0]
    assert SharedCores(1, threads_per_node=2).slowdown() == 1.0  # nobody busy
    with pytest.raises(ValueError, match="cores >= 1"):
        SharedCores(0)


def _run(shared_cores: int | None, specs: list[SimRequestSpec]) -> tuple[Simulator, dict]:  # type: ignore[type-arg]
    site = SimSite("pd", "pd", "h20", 1, 1, shared_cores=shared_cores)
    sc = SimScenario(
        sites=(site,), policy="local_only", prefix_cache=False, local_fabric_gbps=1e9,
        duration_s=1e6, prefill_token_budget=1,
    )  # fmt: skip
    sim = Simulator(sc, iter(specs))
    done: dict[int, tuple[float, float]] = {}
    sim.on_finish = lambda req: done.__setitem__(req.index, (req.kv_ready_s, req.finish_s))
    sim.run()
    assert len(done) == len(specs)
    return sim, done


SPECS = [SimRequestSpec(i, 0.05 * i, 2000 + 311 * (i % 7), 40) for i in range(30)]


def test_a_core_per_node_changes_nothing() -> None:
    _, alone = _run(None, SPECS)
    _, two_cores = _run(2, SPECS)
    assert two_cores == alone


def test_one_core_for_both_serialises_their_work() -> None:
    """Everything arrives at once: the prefill node is busy throughout, the decode node from the
    first KV on, so both share the core nearly all the time and the run takes about their work
    added up (on its own hardware each would overlap the other)."""
    specs = [replace(s, arrival_s=0.0) for s in SPECS]
    sim_alone, alone = _run(None, specs)
    work_s = sum(n.busy_s for n in sim_alone.world.nodes)
    _, shared = _run(1, specs)
    makespan_alone = max(f for _, f in alone.values())
    makespan_shared = max(f for _, f in shared.values())
    assert makespan_shared > 1.2 * makespan_alone
    assert makespan_shared == pytest.approx(work_s, rel=0.1)
    # the first prefill ran alone (the decode node had nothing yet): not slowed
    assert shared[0][0] == pytest.approx(alone[0][0])


def test_a_prefill_goes_on_at_the_speed_the_core_gives_it_now() -> None:
    """Processor sharing through a prefill, not fixed at its start: a long prefill that starts
    while the decode node is busy runs at half speed only while the decode node is busy, then
    at full speed; the core's work is conserved (its end is its own work plus the decode's)."""
    first = SimRequestSpec(0, 0.0, 2000, 30)
    _, alone = _run(None, [first])
    prefill_end_s, decode_end_s = alone[0]
    decode_s = decode_end_s - prefill_end_s  # the decode node's work for the first request
    long = SimRequestSpec(1, prefill_end_s, 30000, 1)  # arrives as the first starts decoding
    _, long_alone = _run(None, [replace(long, index=0, arrival_s=0.0)])
    long_prefill_s = long_alone[0][0]
    assert decode_s < long_prefill_s  # the decode ends first, mid-prefill
    _, shared = _run(1, [first, long])
    # Both at half speed until the decode is done (2 x its work), then the rest alone.
    assert shared[0][1] == pytest.approx(prefill_end_s + 2 * decode_s, rel=1e-3)
    assert shared[1][0] == pytest.approx(prefill_end_s + long_prefill_s + decode_s, rel=1e-3)


def test_a_decode_nodes_own_work_is_its_busy_time_less_the_sharing() -> None:
    """``DecodeNode.work_s``: its steps and installs at its own speed. On a core of its own it is
    the node's busy time; shared, the busy time is stretched and the work is what it was alone
    (the same steps, whatever the batches: everything arrives at once, so they form the same)."""
    specs = [replace(s, arrival_s=0.0) for s in SPECS]
    alone, _ = _run(None, specs)
    shared, _ = _run(1, specs)
    (dec_alone,) = [n for n in alone.world.nodes if n.role.value == "decode"]
    (dec_shared,) = [n for n in shared.world.nodes if n.role.value == "decode"]
    assert dec_alone.work_s == pytest.approx(dec_alone.busy_s)
    assert dec_shared.busy_s > 1.2 * dec_shared.work_s
    assert dec_shared.work_s == pytest.approx(dec_alone.work_s, rel=0.1)
