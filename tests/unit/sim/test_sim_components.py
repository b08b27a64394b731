"""Simulator components against brute force: decode continuous batching (completion times
computed between membership changes vs stepping token by token), link sharing (max-min fair,
TCP window cap, capacity schedule, layer-wise pipelining), and end-to-end invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prfaas.core.ids import LinkId
from prfaas.perf import cost_model_for
from prfaas.sim import LinkConfig, SimScenario, SimSite, Simulator, paper_deployment, summary
from prfaas.sim.link import Flow, SimLink
from prfaas.workload import SimRequestSpec


def _reference_decode(cm, max_batch, arrivals):  # type: ignore[no-untyped-def]
    """Token-by-token continuous batching: a request whose KV is ready at time a joins at the
    first step boundary at or after a (FIFO, at most max_batch); returns finish times."""
    t = 0.0
    active: list[list[int]] = []  # [index, remaining, context]
    waiting = sorted(range(len(arrivals)), key=lambda i: arrivals[i][0])
    finish = [0.0] * len(arrivals)
    while waiting or active:
        while waiting and arrivals[waiting[0]][0] <= t and len(active) < max_batch:
            i = waiting.pop(0)
            # The prefill sampled the first token: the node steps for the rest.
            active.append([i, arrivals[i][2] - 1, arrivals[i][1]])
        if not active:
            t = arrivals[waiting[0]][0]
            continue
        ctx = sum(a[2] for a in active)
        t += cm.decode_step_s(len(active), ctx)
        for a in active:
            a[1] -= 1
            a[2] += 1
        for a in [a for a in active if a[1] == 0]:
            finish[a[0]] = t
            active.remove(a)
    return finish


@pytest.mark.parametrize("hardware", ["h20", "h100"])
def test_decode_batching_matches_token_by_token(hardware: str) -> None:
    """h20 has the flat profiled step; h100 uses the roofline (step grows with context)."""
    cm = cost_model_for("paper-1t", hardware)
    sc = SimScenario(
        sites=(SimSite("pd", "pd", hardware, 1, 1),), policy="local_only",
        prefix_cache=False, local_fabric_gbps=1e9, duration_s=1e6,
    )  # fmt: skip
    specs = [SimRequestSpec(i, 0.37 * i, 100 + 13 * i, 5 + (i * 7) % 23) for i in range(40)]
    sim = Simulator(sc, iter(specs))
    done: dict[int, tuple[float, float]] = {}
    sim.on_finish = lambda req: done.__setitem__(req.index, (req.kv_ready_s, req.finish_s))
    sim.run()
    assert len(done) == 40
    arrivals = [
        (done[i][0], specs[i].num_prompt_tokens, specs[i].num_output_tokens) for i in range(40)
    ]
    want = _reference_decode(cm, cm.max_decode_batch, arrivals)
    for i in range(40):
        assert done[i][1] == pytest.approx(want[i], rel=1e-9, abs=1e-9), i


def _link(
    capacity: float, rtt: float = 0.0, conns: int = 1, window: float = 1e18
) -> tuple[SimLink, list]:  # type: ignore[type-arg]
    events: list[tuple[float, Flow]] = []
    link = SimLink(
        LinkId("a->b"), capacity, rtt, conns, window, lambda t, f, v: events.append((t, f))
    )
    return link, events


def _current(events, flow):  # type: ignore[no-untyped-def]
    return [t for t, f in events if f is flow][-1]


def test_link_max_min_fair_and_window_cap() -> None:
    link, ev = _link(100.0)
    a = link.add(0.0, 100.0, 0.0, "a", 1)
    b = link.add(0.0, 300.0, 0.0, "b", 1)
    assert a.rate == b.rate == 50.0
    assert _current(ev, a) == pytest.approx(2.0)
    link.finish(a, 2.0)
    assert b.rate == 100.0
    assert _current(ev, b) == pytest.approx(4.0)  # 200 left at 100/s
    # Window cap: 2 connections x 10 bytes / 0.5 s RTT = 40 B/s whatever the capacity.
    link2, ev2 = _link(1000.0, rtt=0.5, conns=2, window=10.0)
    c = link2.add(0.0, 80.0, 0.0, "c", 1)
    assert c.rate == pytest.approx(40.0)
    assert _current(ev2, c) == pytest.approx(2.0)


def test_link_capacity_change_and_pipelining() -> None:
    link, ev = _link(100.0)
    f = link.add(0.0, 1000.0, 0.0, "f", 1)
    link.set_capacity(5.0, 10.0)  # 500 sent, 500 left at 10/s
    assert _current(ev, f) == pytest.approx(55.0)
    # Layer-wise: 4 layers, 400 bytes over a 4 s prefill: 300 bytes may go during the prefill,
    # the last layer's 100 bytes after it ends; so the transfer ends at 4 + 100/100 = 5 s.
    link2, ev2 = _link(100.0)
    g = link2.add(0.0, 400.0, 4.0, "g", 4)
    assert g.rate == pytest.approx(75.0)
    link2.produced(g, 4.0)
    assert _current(ev2, g) == pytest.approx(5.0)
    assert link2.backlog_bytes(4.0) == pytest.approx(100.0)


def test_every_request_finishes_and_the_link_carries_only_offloads() -> None:
    sc = replace(paper_deployment("paper-prfaas", rate_rps=3.0), duration_s=200.0)
    sim = Simulator(sc)
    sim.run()
    s = summary(sim)
    r = s["requests"]
    assert r["unfinished"] == 0 and r["completed"] == r["arrived"] == 600
    assert s["links"]["prfaas->pd"]["num_transfers"] == r["offloaded"]
    assert s["tpot_s"]["max"] == pytest.approx(0.025)
    assert s["sites"]["prfaas"]["requests_prefilled"] == r["offloaded"]


def test_two_pd_sites_share_one_prfaas_site() -> None:
    sites = (
        SimSite("pd0", "pd", "h20", 3, 5),
        SimSite("pd1", "pd", "h20", 3, 5),
        SimSite("prfaas", "prfaas", "h200", 4),
    )
    links = (LinkConfig("prfaas", "pd0", 100.0, 5.0), LinkConfig("prfaas", "pd1", 50.0, 20.0))
    sc = replace(paper_deployment("paper-prfaas", rate_rps=3.0), sites=sites, links=links,
                 duration_s=200.0)  # fmt: skip
    sim = Simulator(sc)
    sim.run()
    s = summary(sim)
    assert s["requests"]["unfinished"] == 0
    assert s["links"]["prfaas->pd0"]["num_transfers"] > 0
    assert s["links"]["prfaas->pd1"]["num_transfers"] > 0
    assert s["sites"]["pd0"]["requests_prefilled"] + s["sites"]["pd1"]["requests_prefilled"] > 0


class _StubNode:
    """What ``PoolIndex`` reads of a node: its index, key, draining flag and cached load."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.key = 0
        self.heap_key = 0
        self.draining = False
        self.cached_load = None

    def load_key(self) -> int:
        return self.key


@pytest.mark.timeout(30)
def test_pool_index_lazy_heap_picks_the_least_key_then_index_as_a_scan_does() -> None:
    """``PoolIndex`` (a small pool's scan; a large one's heap, which moves an entry only when
    a load falls or when a grown one surfaces) answers what a scan of the members answers: the
    least (key, index) of the accepting members, ties included (small integer keys, as decode
    loads are), also as removals take a pool from one form to the other."""
    import random

    from prfaas.sim.nodes import PoolIndex

    rng = random.Random(7)
    for _ in range(40):
        pool: PoolIndex = PoolIndex()  # type: ignore[type-arg]
        nodes = [_StubNode(i) for i in range(rng.choice((rng.randint(1, 9), rng.randint(14, 30))))]
        for n in nodes:
            n.key = rng.randint(0, 3)
            pool.add(n)  # type: ignore[arg-type]
        for _ in range(400):
            n = rng.choice(nodes)
            action = rng.random()
            if action < 0.03 and n.index in pool.members:
                n.draining = True  # the simulator drains, then removes once idle
            elif action < 0.08 and n.draining:
                pool.remove(n)  # type: ignore[arg-type]
            else:
                n.key = max(0, n.key + rng.choice((-2, -1, 1, 1, 2, 3)))
                pool.touch(n)  # type: ignore[arg-type]
            accepting = [m for m in nodes if not m.draining and pool.members.get(m.index) is m]
            want = min(accepting, key=lambda m: (m.key, m.index)) if accepting else None
            assert pool.best() is want
