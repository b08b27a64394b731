"""The simulator moves each request through ``core.RequestState``'s one transition table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prfaas.core import InvalidTransition, RequestState
from prfaas.sim import Simulator, paper_deployment
from prfaas.sim.events import EventKind, Handoff
from prfaas.sim.nodes import DecodeNode, PrefillNode
from prfaas.sim.request import SimRequest

pytestmark = pytest.mark.timeout(60)

S = RequestState


def test_finished_requests_went_through_every_stage_in_order() -> None:
    sc = replace(paper_deployment("paper-prfaas", rate_rps=3.0), duration_s=100.0)
    sim = Simulator(sc)
    done: list[SimRequest] = []
    sim.on_finish = done.append
    sim.run()
    assert len(done) == sim.metrics.num_arrived == 300
    for r in done:
        assert r.state is S.FINISHED
        times = (r.arrival_s, r.prefill_start_s, r.prefill_end_s, r.kv_ready_s, r.decode_start_s,
                 r.finish_s)  # fmt: skip
        assert min(times) >= 0.0 and list(times) == sorted(times), r.index


def test_mid_run_each_request_is_in_the_state_of_where_it_sits() -> None:
    sc = replace(paper_deployment("paper-prfaas", rate_rps=6.0), duration_s=200.0)
    sim = Simulator(sc)
    seen: set[RequestState] = set()
    for k in range(200):  # snapshots: one instant rarely holds every stage
        sim.run(until_s=100.0 + 0.25 * k)
        for node in sim.nodes:
            if isinstance(node, PrefillNode):
                for r in node.queue:  # waiting for a batch: routed, not started
                    assert r.state is S.ROUTED and r.prefill_start_s == -1.0
                    seen.add(r.state)
            else:
                for _, _, r in node.members:
                    assert r.state is S.DECODING and r.finish_s == -1.0
                    seen.add(r.state)
                for r in node.waiting:
                    assert r.state is S.DECODING and r.decode_start_s == -1.0
        for event in sim.world.q.heap:
            kind = event[1]
            if kind is EventKind.PREFILL_DONE:  # a batch running: its requests are prefilling
                for h in event[4]:
                    assert h.req.state is S.PREFILLING and h.req.prefill_end_s == -1.0
                    seen.add(h.req.state)
            elif kind is EventKind.FLOW_DONE and isinstance(event[3].payload, Handoff):
                flow = event[3]
                if event[4] != flow.version or flow.finished:
                    continue  # superseded (the flow was rescheduled): discarded when popped
                r = flow.payload.req
                # The KV streams from the batch's start: the prefill may still be running.
                assert r.state is (S.PREFILLING if r.prefill_end_s < 0 else S.TRANSFERRING)
                seen.add(r.state)
            elif kind is EventKind.KV_ARRIVE:
                assert event[3].state is S.TRANSFERRING
                seen.add(S.TRANSFERRING)
    assert {S.ROUTED, S.PREFILLING, S.TRANSFERRING, S.DECODING} <= seen


def test_a_move_the_table_forbids_raises_and_changes_nothing() -> None:
    sc = replace(paper_deployment("paper-prfaas", rate_rps=1.0), duration_s=10.0)
    sim = Simulator(sc)
    dec = next(n for n in sim.nodes if isinstance(n, DecodeNode))
    req = SimRequest(99, 0.0, 1000, 10, (), dec.site)
    dec.reserved += 1
    with pytest.raises(InvalidTransition, match="request r99: queued -> decoding"):
        sim.decode.on_kv_arrive(Handoff(req, dec))  # KV "arrives" for a request never routed
    assert req.state is S.QUEUED and req.kv_ready_s == -1.0
    assert not dec.members and not dec.waiting
