"""engine.torch's one engine thread: many concurrent prefills and decodes on one engine never run
two forward passes at once, never mix requests, and interleave decode steps with prefill chunks;
a request that fails inside the engine fails alone; a dead engine thread fails everything pending
with its reason and says so in ``fault``."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable

import pytest
from engine_helpers import NEW_TOKENS, assert_greedy_tokens, prompt

from prfaas.engine import (
    EngineDead,
    FinishReason,
    LayerOutput,
    LayoutManifest,
    PrefillRequest,
    PrefillResult,
    SamplingParams,
    TokenEvent,
)
from prfaas.engine.torch import LoadedModel, TorchEngine, decode_step
from prfaas.engine.torch import engine as engine_module

Loaded = Callable[[str, str], LoadedModel]
CHUNK = 64
GREEDY = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
NUM_CONCURRENT = 24
SEEDS = (0, 1, 2)  # 8 identical copies of each prompt: a mix-up shows as another prompt's text


class PassLog:
    """Records every forward pass of a model: its thread, its shape, and whether another pass
    was running at the same time (hooks on the top-level model, removed afterwards)."""

    def __init__(self, model: LoadedModel) -> None:
        self.passes: list[tuple[int, int, int]] = []  # (thread id, batch, tokens per row)
        self.max_active = 0
        self._active = 0
        self._lock = threading.Lock()
        top = model.model
        self._handles = [
            top.register_forward_pre_hook(self._enter, with_kwargs=True),
            top.register_forward_hook(self._leave),
        ]

    def _enter(self, _module: object, _args: object, kwargs: dict[str, object]) -> None:
        ids = kwargs["input_ids"]
        with self._lock:
            self._active += 1
            self.max_active = max(self.max_active, self._active)
            self.passes.append((threading.get_ident(), *ids.shape))  # type: ignore[attr-defined]

    def _leave(self, *_: object) -> None:
        with self._lock:
            self._active -= 1

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _digest(outputs: list[LayerOutput]) -> str:
    """Each layer assembled as the receiver would (parts of a chunked prefill land by offset)."""
    layers: dict[int, bytearray] = {}
    for out in outputs:
        buf = layers.setdefault(out.position, bytearray(out.segment.num_bytes))
        for offset, view in out.pieces():
            buf[offset : offset + view.nbytes] = view
    h = hashlib.sha256()
    for pos in sorted(layers):
        h.update(layers[pos])
    return h.hexdigest()


async def _prefill(engine: TorchEngine, req: PrefillRequest) -> tuple[str, PrefillResult]:
    layers: list[LayerOutput] = []
    result = None
    async for item in engine.prefill_stream(req, keep=True):
        if isinstance(item, LayerOutput):
            layers.append(item)
        else:
            result = item
    assert result is not None
    return _digest(layers), result


def _sequential(model: LoadedModel, seed: int) -> tuple[str, list[int]]:
    """A lone run: its KV digest, then its tokens decoded alone."""

    async def run() -> tuple[str, list[int]]:
        engine = TorchEngine(model, prefill_chunk_tokens=CHUNK)
        try:
            digest, result = await _prefill(engine, PrefillRequest("alone", prompt(seed), GREEDY))
            tokens = list(engine.start(result, GREEDY).token_ids)
            while engine.num_running:
                for ev in await engine.step_async():
                    tokens.extend(ev.token_ids)
            return digest, tokens
        finally:
            engine.close()

    return asyncio.run(run())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arch", ["qwen3_next", "llama"])
def test_concurrent_requests_match_lone_runs_on_one_thread(arch: str, loaded: Loaded) -> None:
    model = loaded(arch, "bf16")  # batch-invariant decode: a request's batch-mates change nothing
    lone = {seed: _sequential(model, seed) for seed in SEEDS}
    engine = TorchEngine(model, prefill_chunk_tokens=CHUNK)
    log = PassLog(model)
    tokens: dict[str, list[int]] = {}
    digests: dict[str, str] = {}
    seed_of = {f"r{i}": SEEDS[i % len(SEEDS)] for i in range(NUM_CONCURRENT)}

    async def one(rid: str) -> None:
        req = PrefillRequest(rid, prompt(seed_of[rid]), GREEDY)
        digests[rid], result = await _prefill(engine, req)
        tokens[rid] = list(engine.start(result, GREEDY).token_ids)

    async def run() -> None:
        prefills = asyncio.gather(*(one(rid) for rid in seed_of))
        while not prefills.done() or engine.num_running:  # the node's decode loop, in short
            if engine.num_running == 0:
                await asyncio.sleep(0.001)
                continue
            for ev in await engine.step_async():
                assert ev.finish_reason is not FinishReason.ERROR, ev.error
                tokens[ev.request_id].extend(ev.token_ids)
        await prefills

    try:
        asyncio.run(asyncio.wait_for(run(), 90))
    finally:
        log.remove()
        engine.close()
    assert log.max_active == 1
    assert len({thread for thread, _, _ in log.passes}) == 1
    assert log.passes[0][0] != threading.get_ident()
    # A decode step ([batch, 1]) ran between two chunks ([1, CHUNK]) of one prefill.
    shapes = [(b, q) for _, b, q in log.passes]
    assert any(
        shapes[i] == (1, CHUNK) and shapes[i + 1][1] == 1 and shapes[i + 2][1] > 1
        for i in range(len(shapes) - 2)
    ), shapes
    for rid, seed in seed_of.items():
        assert digests[rid] == lone[seed][0], f"{rid}: KV differs from a lone run's"
        assert_greedy_tokens(model, prompt(seed), tokens[rid], lone[seed][1], rid)
    assert engine.budget.used_bytes == 0


@pytest.mark.timeout(60)
async def test_a_request_whose_sampling_raises_fails_alone(
    loaded: Loaded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sampling that raises for one request (seed 13) at its 4th token: that request ends with
    an ERROR event and leaves the batch; its batch-mates finish with their lone-run tokens. At a
    prefill's first token (seed 14) it fails that prefill alone."""
    model = loaded("qwen3_next", "bf16")
    real_choose = engine_module.choose

    def choose(logits, params, token_index, *args):  # type: ignore[no-untyped-def]
        if (params.seed, token_index) in {(13, 3), (14, 0)}:
            raise RuntimeError("injected sampling fault")
        return real_choose(logits, params, token_index, *args)

    # A prefill's first token is sampled in the engine, a decode step's in ``decode_step``.
    for module in (engine_module, decode_step):
        monkeypatch.setattr(module, "choose", choose)
    poisoned = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, seed=13)
    with TorchEngine(model) as engine:
        tokens: dict[str, list[int]] = {}
        for rid, seed, sampling in (("a", 0, GREEDY), ("bad", 1, poisoned), ("b", 2, GREEDY)):
            result = engine.prefill(PrefillRequest(rid, prompt(seed), sampling))
            tokens[rid] = list(engine.start(result, sampling).token_ids)
        errors: list[TokenEvent] = []
        async with asyncio.timeout(30):
            while engine.num_running:
                for ev in await engine.step_async():
                    if ev.finish_reason is FinishReason.ERROR:
                        errors.append(ev)
                    else:
                        tokens[ev.request_id].extend(ev.token_ids)
        assert [(e.request_id, e.token_ids) for e in errors] == [("bad", ())]
        assert "injected sampling fault" in errors[0].error
        assert len(tokens["bad"]) == 3
        for rid, seed in (("a", 0), ("b", 2)):
            expected = TorchEngine(model).generate(PrefillRequest("x", prompt(seed), GREEDY))
            assert_greedy_tokens(model, prompt(seed), tokens[rid], expected, rid)
        assert engine.budget.used_bytes == 0
        # The same fault at a prefill's first token fails that prefill alone.
        with pytest.raises(RuntimeError, match="injected"):
            engine.prefill(PrefillRequest("p", prompt(0), SamplingParams(seed=14)))
        assert engine.fault == ""
        assert len(engine.generate(PrefillRequest("after", prompt(1), GREEDY))) == NEW_TOKENS


@pytest.mark.timeout(60)
async def test_a_dead_engine_thread_sets_fault_and_fails_pending(
    loaded: Loaded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every decode pass raises (a broken device): the step of two requests fails, each alone
    too, so the engine stops; the queued prefill and the step fail with the fault, and so does
    everything after."""
    model = loaded("llama", "fp32")
    engine = TorchEngine(model)
    for rid, seed in (("a", 0), ("b", 1)):
        engine.start(engine.prefill(PrefillRequest(rid, prompt(seed), GREEDY)), GREEDY)
    gate = threading.Event()

    def broken(_runs: object) -> object:
        gate.wait(10)
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine, "_forward_step", broken)
    async with asyncio.timeout(30):
        step = asyncio.ensure_future(engine.step_async())
        await asyncio.sleep(0.05)  # the engine thread is inside the step now
        stream = engine.prefill_stream(PrefillRequest("p", prompt(2), GREEDY))
        queued = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.05)
        gate.set()
        with pytest.raises(EngineDead, match="device lost"):
            await step
        with pytest.raises(EngineDead, match="device lost"):
            await queued
    assert "engine thread died" in engine.fault and "device lost" in engine.fault
    with pytest.raises(EngineDead):
        await engine.step_async()
    with pytest.raises(EngineDead):
        engine.prefill(PrefillRequest("later", prompt(0), GREEDY))
    with pytest.raises(EngineDead):
        engine.allocate(LayoutManifest.of("d", engine.layout(10)), 4)
    assert engine._prefilling == set()  # the refused and the failed prefill reserved nothing
    engine.close()  # the thread is gone already: returns at once


@pytest.mark.timeout(60)
async def test_a_decode_node_whose_engine_thread_dies_reports_it(
    loaded: Loaded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node around a torch engine: streams running when the thread dies end with its reason,
    ``NodeReport.fault`` carries it, and a new stream fails at once instead of hanging."""
    from prfaas.core import NodeRole
    from prfaas.serve.node.messages import DecodeCommand, DecodeEvent, SamplingMsg
    from prfaas.serve.node.worker import Node
    from prfaas.transfer import Manifest

    model = loaded("llama", "fp32")
    prefiller, engine = TorchEngine(model), TorchEngine(model)
    node = Node("d0", "s", NodeRole.DECODE, engine, None)
    decoding = asyncio.ensure_future(node.decode_loop())
    msg = SamplingMsg(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    streams: dict[str, list[DecodeEvent]] = {}

    async def listen(rid: str) -> None:
        cmd = DecodeCommand(request_id=rid, num_prompt_tokens=len(prompt(0)), sampling=msg)
        streams[rid] = [event async for event in node.decode(cmd)]

    try:
        async with asyncio.timeout(40):
            gate = threading.Event()

            def broken(_runs: object) -> object:
                gate.wait(10)
                raise RuntimeError("device lost")

            monkeypatch.setattr(engine, "_forward_step", broken)
            listeners = [asyncio.ensure_future(listen(rid)) for rid in ("a", "b")]
            await asyncio.sleep(0.01)
            for rid in ("a", "b"):
                result = prefiller.prefill(PrefillRequest(rid, prompt(0), GREEDY))
                buffers = node.allocate(Manifest.from_layout(rid, engine.layout(len(prompt(0)))))
                for out, buf in zip(prefiller.export(rid), buffers, strict=True):
                    buf[:] = b"".join(bytes(v) for v in out.buffers)
                node.on_delivered(rid, result.first_token)
            gate.set()
            await asyncio.gather(*listeners)
            assert "device lost" in node.report().fault
            for rid in ("a", "b"):
                assert streams[rid][-1].kind == "error", streams[rid]
                assert "engine thread died" in streams[rid][-1].error
            await listen("c")
            assert [e.kind for e in streams["c"]] == ["error"]
            assert engine.budget.used_bytes == 0
    finally:
        decoding.cancel()
        node.close()
        prefiller.close()


@pytest.mark.timeout(60)
async def test_a_cancelled_prefill_stops_at_its_next_chunk(loaded: Loaded) -> None:
    """While a request decodes, a prefill runs in chunks of 32; its consumer goes away during
    chunk 2: no third chunk runs, the engine holds nothing for it, the next request runs. With
    nothing decoding, a prefill is not cut (its layers still stream during its one pass)."""
    model = loaded("qwen3_next", "fp32")
    engine = TorchEngine(model, prefill_chunk_tokens=32)
    engine.start(engine.prefill(PrefillRequest("bg", prompt(3), GREEDY)), GREEDY)
    shapes: list[tuple[int, int]] = []
    in_second, release = threading.Event(), threading.Event()

    def pre_hook(_module: object, _args: object, kwargs: dict[str, object]) -> None:
        shapes.append(tuple(kwargs["input_ids"].shape))  # type: ignore[attr-defined]
        if len(shapes) == 2:
            in_second.set()
            release.wait(10)

    handle = model.model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        async with asyncio.timeout(40):
            consumer = asyncio.ensure_future(
                _prefill(engine, PrefillRequest("long", prompt(0), GREEDY))
            )
            assert await asyncio.to_thread(in_second.wait, 10)
            consumer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await consumer
            release.set()
            _, result = await _prefill(engine, PrefillRequest("next", prompt(1, 20), GREEDY))
            assert engine._prefilling == set() and set(engine._held) == {"next"}
            engine.release("bg")
            await _prefill(engine, PrefillRequest("solo", prompt(0), GREEDY))
    finally:
        handle.remove()
        release.set()
        engine.close()
    assert shapes == [(1, 32), (1, 32), (1, 20), (1, len(prompt(0)))]
    assert result.num_tokens == 20


@pytest.mark.timeout(60)
def test_checkpoints_of_a_chunked_prefill_match_an_unchunked_one(loaded: Loaded) -> None:
    """Chunks of 48 cut across 64-token blocks while a request decodes: the block checkpoints
    are still taken at 64, 128, 192, with the states of a prefill that was not cut."""
    import numpy as np

    model = loaded("qwen3_next", "fp32")
    req = PrefillRequest("c", prompt(0), GREEDY, checkpoint_block_tokens=64)
    whole, cut = TorchEngine(model, prefill_chunk_tokens=48), TorchEngine(model, 4 << 30, 64, 48)
    with whole, cut:
        cut.start(cut.prefill(PrefillRequest("bg", prompt(3), GREEDY)), GREEDY)
        results = [whole.prefill(req)]
        log = PassLog(model)
        try:
            results.append(cut.prefill(req))
        finally:
            log.remove()
    assert [q for _, _, q in log.passes] == [48, 16, 48, 16, 48, 16, 37]  # cut at 48 and at 64s
    for result in results:
        assert [c.num_tokens for c in result.checkpoints] == [64, 128, 192]
    assert results[0].first_token == results[1].first_token
    for a, b in zip(results[0].checkpoints, results[1].checkpoints, strict=True):
        for la, lb in zip(a.layers, b.layers, strict=True):
            for x, y in zip(la.buffers, lb.buffers, strict=True):
                fx, fy = np.frombuffer(x, np.float32), np.frombuffer(y, np.float32)
                assert np.allclose(fx, fy, atol=1e-4), (a.num_tokens, la.position)
