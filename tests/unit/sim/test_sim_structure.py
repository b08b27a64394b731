"""The simulator's structure: ``KvBytes`` is ``CacheSpec.bytes_for`` / ``transfer_bytes`` for
every preset (so a sliding-window layer charges a short prompt its own length, not the whole
window); every event kind has a handler; every scheduled event is a plain tuple of its kind's
event type, every item of the type its alias says (and every flow payload its ``NamedTuple``)."""

from __future__ import annotations

import types
import typing
from dataclasses import replace

import pytest

from prfaas.sim import Simulator, paper_deployment
from prfaas.sim.events import EVENT_TYPES, CacheMove, Event, EventKind, Handoff
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


def _check_value(value: object, hint: object, where: str) -> None:
    """``value`` is of type ``hint`` (a class, a union, a ``tuple[X, ...]``, a fixed tuple or a
    NamedTuple)."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        assert type(value) is tuple, where
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            for i, v in enumerate(value):
                _check_value(v, args[0], f"{where}[{i}]")
        else:  # an event alias: one type per item
            assert len(value) == len(args), (where, len(value), args)
            for i, (v, item) in enumerate(zip(value, args, strict=True)):
                _check_value(v, item, f"{where}[{i}]")
    elif origin in (typing.Union, types.UnionType):
        assert isinstance(value, typing.get_args(hint)), (where, type(value))
    else:
        assert isinstance(hint, type), (where, hint)
        assert isinstance(value, hint), (where, type(value), hint)
        if hint is float:  # an int time would still order, but the field says float
            assert type(value) is float, where
        if issubclass(hint, tuple) and hint is not tuple:
            _check_fields(value, hint, where)


def _check_fields(value: object, cls: type, where: str) -> None:
    assert type(value) is cls, (where, type(value), cls)
    assert isinstance(value, tuple)
    hints = typing.get_type_hints(cls)  # a NamedTuple's annotations are its fields, in order
    assert len(value) == len(hints), where
    for v, (name, hint) in zip(value, hints.items(), strict=True):
        _check_value(v, hint, f"{where}.{name}")


def _check_event(event: Event) -> None:
    kind = event[1]
    assert type(kind) is EventKind
    _check_value(event, EVENT_TYPES[kind], kind.name)


def test_every_event_kind_has_a_handler_and_its_event_type() -> None:
    sc = paper_deployment("paper-prfaas", rate_rps=3.0)
    link = replace(sc.links[0], schedule=((20.0, 10.0), (40.0, 100.0)))
    sc = replace(sc, links=(link,), policy="prfaas", duration_s=60.0, timeseries=True,
                 rebalance=True)  # fmt: skip
    sim = Simulator(sc)
    seen: set[EventKind] = set()
    t = 0.0
    while not sim.done and t < 200.0:
        # Between slices, inspect everything scheduled and not yet run.
        for event in sim.world.q.heap:
            _check_event(event)
            seen.add(event[1])
            if event[1] is EventKind.FLOW_DONE:  # a flow carries a Handoff or a CacheMove
                payload = event[3].payload
                want = Handoff if isinstance(payload, Handoff) else CacheMove
                _check_fields(payload, want, "flow payload")
        t += 0.5
        sim.run(until_s=t)
    assert sim.metrics.num_completed == sim.metrics.num_arrived > 100
    assert {EventKind.ARRIVAL, EventKind.FLOW_DONE, EventKind.DECODE_TICK} <= seen
    assert {EventKind.KV_ARRIVE, EventKind.PREFILL_DONE, EventKind.CAPACITY} <= seen
    assert {EventKind.SAMPLE, EventKind.CONTROL} <= seen
    assert set(EVENT_TYPES) == set(EventKind)
