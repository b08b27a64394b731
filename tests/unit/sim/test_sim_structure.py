"""The simulator's structure: ``KvBytes`` is ``CacheSpec.bytes_for`` / ``transfer_bytes`` for
every preset (so a sliding-window layer charges a short prompt its own length, not the whole
window); every event kind has a handler; every scheduled event carries its kind's payload type."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prfaas.sim import Simulator, paper_deployment
from prfaas.sim.events import PAYLOAD_TYPES, EventKind
from prfaas.sim.kv_bytes import KvBytes
from prfaas.spec.presets import get_model, model_names
from prfaas.workload import SimRequestSpec

_LENGTHS = (0, 1, 5, 127, 128, 129, 1000, 4096, 32768, 131072)


@pytest.mark.parametrize("model", model_names())
def test_kv_bytes_is_cache_spec_bytes_for(model: str) -> None:
    cache = get_model(model).cache
    kvb = KvBytes(cache)
    for n in _LENGTHS:
        assert kvb.total(n) == cache.bytes_for(n), n
        for cached in {0, n // 3, n} if n > 0 else set():
            assert kvb.to_send(n, cached) == cache.transfer_bytes(n, cached), (n, cached)


def test_a_short_prompt_is_not_charged_the_whole_sliding_window() -> None:
    """mimo-v2-flash: 40 SWA layers with a 128-token window; a 10-token request's decode KV
    is ``bytes_for(10 + output)``, below what the old ``fixed + window`` formula charged."""
    cache = get_model("mimo-v2-flash").cache
    sc = paper_deployment("paper-prfaas", rate_rps=1.0)
    sc = replace(sc, model="mimo-v2-flash", policy="local_only", prefix_cache=False)
    specs = [SimRequestSpec(0, 0.0, 10, 4)]
    sim = Simulator(sc, iter(specs))
    seen: list[int] = []
    sim.on_finish = lambda req: seen.append(req.kv_bytes)
    sim.run()
    assert seen == [cache.bytes_for(14)]
    window_charged = sum(la.bytes_per_token * 128 for la in cache.layers if la.kind.value == "swa")
    assert seen[0] < window_charged


def test_every_event_kind_has_a_handler_and_its_payload_type() -> None:
    sc = paper_deployment("paper-prfaas", rate_rps=3.0)
    link = replace(sc.links[0], schedule=((20.0, 10.0), (40.0, 100.0)))
    sc = replace(sc, links=(link,), policy="prfaas", duration_s=60.0, timeseries=True,
                 rebalance=True)  # fmt: skip
    sim = Simulator(sc)
    seen: set[EventKind] = set()
    t = 0.0
    while not sim.done and t < 200.0:
        # Between slices, inspect everything scheduled and not yet run.
        for _, kind, _, payload in sim.world.q.heap:
            want = PAYLOAD_TYPES[kind]
            if want is None:
                assert payload is None, kind
            else:
                assert isinstance(payload, want), (kind, type(payload))
            seen.add(kind)
        t += 0.5
        sim.run(until_s=t)
    assert sim.metrics.num_completed == sim.metrics.num_arrived > 100
    assert {EventKind.ARRIVAL, EventKind.FLOW_DONE, EventKind.DECODE_TICK} <= seen
    assert {EventKind.KV_ARRIVE, EventKind.PREFILL_DONE, EventKind.CAPACITY} <= seen
    assert {EventKind.SAMPLE, EventKind.CONTROL} <= seen
    assert set(PAYLOAD_TYPES) == set(EventKind)
