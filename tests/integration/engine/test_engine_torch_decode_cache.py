"""engine.torch's decode step on the CPU gathers the batch into kept buffers and appends each
request's new rows to a buffer of its own (``batch_workspace``, ``hf_cache.append_step``): the
same caches and tokens, step by step, as the step that concatenates the batch afresh and hands
back views of it (``hf_cache.split_cache``, the GPU's path), through joins, leaves, a window
shorter than the context (Mistral) and recurrent states (Qwen3-Next)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from engine_helpers import prompt

from prfaas.engine import PrefillRequest, SamplingParams
from prfaas.engine.torch import LoadedModel, TorchEngine, hf_cache

Loaded = Callable[[str, str], LoadedModel]


def _caches(engine: TorchEngine) -> dict[str, hf_cache.RequestCache]:
    return {rid: run.cache for rid, run in engine._running.items()}


def _assert_same_cache(a: hf_cache.RequestCache, b: hf_cache.RequestCache, what: str) -> None:
    assert a.num_tokens == b.num_tokens, what
    for pos, (la, lb) in enumerate(zip(a.layers, b.layers, strict=True)):
        for name in la:
            assert la[name].shape == lb[name].shape, f"{what}: layer {pos} {name}"
            assert torch.equal(la[name], lb[name]), f"{what}: layer {pos} {name} differs"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arch", ["qwen3_next", "mistral"])
def test_in_place_steps_match_fresh_batches(arch: str, loaded: Loaded) -> None:
    model = loaded(arch, "fp32")
    kept, fresh = TorchEngine(model), TorchEngine(model)
    fresh._workspace = None  # the concatenating step, as on a GPU
    assert kept._workspace is not None
    lengths = {"a": 150, "b": 40, "c": 260, "d": 97}  # c joins later, longer than the rest
    outputs = {"a": 12, "b": 5, "c": 9, "d": 14}  # b leaves early
    try:
        for engine in (kept, fresh):
            for rid in ("a", "b", "d"):
                sampling = SamplingParams(max_new_tokens=outputs[rid], ignore_eos=True)
                req = PrefillRequest(rid, prompt(ord(rid), lengths[rid]), sampling)
                engine.start(engine.prefill(req), sampling)
        for step in range(16):
            if step == 3:
                for engine in (kept, fresh):
                    sampling = SamplingParams(max_new_tokens=outputs["c"], ignore_eos=True)
                    req = PrefillRequest("c", prompt(3, lengths["c"]), sampling)
                    engine.start(engine.prefill(req), sampling)
            for buf in kept._workspace._buffers.values():
                buf.fill_(float("nan"))  # what a fresh buffer may hold: padding must not read it
            got, want = kept.step(), fresh.step()
            assert got == want, f"step {step}"
            a, b = _caches(kept), _caches(fresh)
            assert a.keys() == b.keys(), f"step {step}"
            for rid in a:
                _assert_same_cache(a[rid], b[rid], f"step {step}, request {rid}")
        assert kept.num_running == fresh.num_running == 0
        assert kept._workspace._buffers == {}, "the last request left: buffers given back"
    finally:
        kept.close()
        fresh.close()


@pytest.mark.timeout(60)
def test_a_lone_request_past_its_window_matches_fresh_batches(loaded: Loaded) -> None:
    """One request (a one-row step runs two rows, and appends once), generating past Mistral's
    96-token window: its buffer fills and is copied into a new one on the way."""
    model = loaded("mistral", "fp32")
    kept, fresh = TorchEngine(model), TorchEngine(model)
    fresh._workspace = None
    sampling = SamplingParams(max_new_tokens=130, ignore_eos=True)
    try:
        for engine in (kept, fresh):
            engine.start(engine.prefill(PrefillRequest("w", prompt(5, 60), sampling)), sampling)
        refills, last = 0, None
        for step in range(129):
            assert kept.step() == fresh.step(), f"step {step}"
            if kept.num_running:
                a, b = _caches(kept)["w"], _caches(fresh)["w"]
                _assert_same_cache(a, b, f"step {step}")
                buf = next(iter(a.room.values()))[0]
                refills += last is not None and buf is not last
                last = buf
        assert kept.num_running == fresh.num_running == 0
        assert refills >= 1, "the window's buffer was never refilled"
    finally:
        kept.close()
        fresh.close()


@pytest.mark.timeout(60)
def test_a_request_appends_into_one_buffer_and_a_stale_cache_cannot_corrupt_it(
    loaded: Loaded,
) -> None:
    model = loaded("llama", "fp32")
    engine = TorchEngine(model)
    sampling = SamplingParams(max_new_tokens=10, ignore_eos=True)
    try:
        for rid, seed in (("x", 1), ("y", 2)):
            req = PrefillRequest(rid, prompt(seed, 120 + 30 * seed), sampling)
            engine.start(engine.prefill(req), sampling)
        engine.step()
        first = {rid: dict(c.room) for rid, c in _caches(engine).items()}
        assert all(first.values()), "the first step gave each request a buffer of its own"
        for rid, room in first.items():
            for (pos, name), (buf, _end) in room.items():
                # Sized for the whole request: prompt + 10 tokens, the first of which came with
                # the prefill.
                assert buf.shape[-2] >= _caches(engine)[rid].num_tokens + 8, (rid, pos, name)
        for _ in range(5):
            engine.step()
        for rid, cache in _caches(engine).items():
            for key, (buf, _end) in cache.room.items():
                assert buf is first[rid][key][0], f"{rid} {key}: reallocated"
        # The step again from the same caches (as ``isolate`` retries one): it writes the same
        # rows past their ends, and the caches it started from still read what they read.
        runs = list(engine._running.values())
        before = [hf_cache.RequestCache(r.cache.num_tokens, [
            {n: t.clone() for n, t in layer.items()} for layer in r.cache.layers
        ]) for r in runs]  # fmt: skip
        once = engine._forward_step(runs)
        twice = engine._forward_step(runs)
        for r, old, (c1, l1), (c2, l2) in zip(runs, before, once, twice, strict=True):
            _assert_same_cache(r.cache, old, "the cache a step started from")
            _assert_same_cache(c1, c2, "a retried step")
            assert torch.equal(l1, l2)
    finally:
        engine.close()
