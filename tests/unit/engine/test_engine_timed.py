"""engine.timed: the cost model's time on a virtual clock, exact payload sizes, chunked decode."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from prfaas.core.clock import LoopClock, VirtualClock
from prfaas.engine import (
    BudgetExceeded,
    LayerOutput,
    LayoutManifest,
    ManifestMismatch,
    PrefillRequest,
    PrefillResult,
    PromptTooLong,
    SamplingParams,
)
from prfaas.engine.timed import TimedConfig, TimedEngine
from prfaas.engine.waiting import LoopWaiter, VirtualWaiter
from prfaas.perf import cost_model_for
from prfaas.spec import LayerKind

LENGTHS = (1024, 8192, 32768, 128000)


def _engine(config: TimedConfig | None = None, clock: VirtualClock | None = None) -> TimedEngine:
    cm = cost_model_for("paper-1t", "h200")
    return TimedEngine(cm, VirtualWaiter(clock or VirtualClock()), config)


async def _prefill(
    engine: TimedEngine, req: PrefillRequest
) -> tuple[list[tuple[float, LayerOutput]], PrefillResult]:
    outs, result = [], None
    async for item in engine.prefill_stream(req):
        if isinstance(item, LayerOutput):
            outs.append((engine.waiter.clock.now(), item))
        else:
            result = item
    assert result is not None
    return outs, result


@pytest.mark.parametrize("num_tokens", LENGTHS)
async def test_prefill_takes_t_prefill_and_emits_s_kv(num_tokens: int) -> None:
    engine = _engine()
    cm = engine.cost_model
    req = PrefillRequest("r", tuple(range(num_tokens)), SamplingParams(max_new_tokens=1))
    outs, result = await _prefill(engine, req)
    assert engine.waiter.clock.now() == cm.prefill_s(num_tokens)
    assert sum(o.num_bytes for _, o in outs) == cm.kv_bytes(num_tokens)
    assert [o.position for _, o in outs] == list(range(cm.model.cache.num_layers))
    times = [t for t, _ in outs]
    assert times == sorted(times) and times[0] < times[-1]  # layer by layer, not all at the end
    assert result.num_tokens == num_tokens and result.num_cached_tokens == 0


@pytest.mark.parametrize("num_tokens", LENGTHS)
async def test_scaled_bytes_and_time(num_tokens: int) -> None:
    divisor, scale = 1000, 0.25
    engine = _engine(TimedConfig(time_scale=scale, byte_divisor=divisor))
    cm = engine.cost_model
    req = PrefillRequest("r", tuple(range(num_tokens)), SamplingParams(max_new_tokens=1))
    outs, _ = await _prefill(engine, req)
    assert engine.waiter.clock.now() == cm.prefill_s(num_tokens) * scale
    layout = cm.model.cache.layout(num_tokens)
    expected = sum(-(-t.num_bytes // divisor) for s in layout.segments for t in s.tensors)
    total = sum(o.num_bytes for _, o in outs)
    assert total == expected
    num_tensors = sum(len(s.tensors) for s in layout.segments)
    assert (
        cm.kv_bytes(num_tokens) / divisor <= total < cm.kv_bytes(num_tokens) / divisor + num_tensors
    )


async def test_cached_prefix_sends_only_the_suffix() -> None:
    engine = _engine()
    cm = engine.cost_model
    cached = await _prefill(
        engine,
        PrefillRequest(
            "p", tuple(range(2048)), SamplingParams(max_new_tokens=1), checkpoint_block_tokens=512
        ),
    )
    prefix = cached[1].checkpoints[1]
    assert prefix.num_tokens == 1024 and [c.num_tokens for c in cached[1].checkpoints] == [
        512,
        1024,
        1536,
        2048,
    ]
    t0 = engine.waiter.clock.now()
    outs, result = await _prefill(
        engine,
        PrefillRequest("r", tuple(range(4096)), SamplingParams(max_new_tokens=1), cached=prefix),
    )
    assert engine.waiter.clock.now() - t0 == pytest.approx(cm.prefill_s(3072, 1024), rel=1e-12)
    assert sum(o.num_bytes for _, o in outs) == cm.model.cache.transfer_bytes(4096, 1024)
    mla = next(o for _, o in outs if o.segment.kind is LayerKind.MLA)
    assert (mla.segment.first_token, mla.segment.num_token_rows) == (1024, 3072)
    assert result.num_cached_tokens == 1024


async def test_decode_in_chunks_of_k_costs_the_closed_form() -> None:
    clock = VirtualClock()
    engine = _engine(TimedConfig(token_chunk=4), clock)
    cm = engine.cost_model
    got: dict[str, list[int]] = {}
    for rid, n, new in (("a", 1000, 10), ("b", 3000, 6)):
        alloc = engine.allocate(LayoutManifest.of(rid, engine.layout(n)), new)
        assert [b.nbytes for b in alloc.layer_buffers] == [
            s.num_bytes for s in alloc.layout.segments
        ]
        got[rid] = list(engine.install(alloc, 7, SamplingParams(max_new_tokens=new)).token_ids)
    # Step 1: both, 4 tokens each; step 2: b needs 1 -> chunk of 1; then a alone.
    expected_s = [
        cm.decode_span_s(2, 1001 + 3001, 4),
        cm.decode_span_s(2, 1005 + 3005, 1),
        cm.decode_span_s(1, 1006, 4),
    ]
    finished = []
    for want in expected_s:
        t0 = clock.now()
        events = await engine.step_async()
        assert clock.now() - t0 == pytest.approx(want, rel=1e-12)
        for ev in events:
            got[ev.request_id].extend(ev.token_ids)
            if ev.finished:
                finished.append(ev.request_id)
    assert finished == ["b", "a"]
    assert len(got["a"]) == 10 and len(got["b"]) == 6
    assert engine.num_running == 0 and engine.budget.used_bytes == 0
    assert await engine.step_async() == ()


def test_allocate_refusals_leave_nothing_behind() -> None:
    engine = _engine(TimedConfig(kv_budget_bytes=2**30))
    cm = engine.cost_model
    with pytest.raises(BudgetExceeded, match="needs"):
        engine.allocate(LayoutManifest.of("big", engine.layout(100_000)), 16)
    with pytest.raises(PromptTooLong, match="131072"):
        engine.allocate(LayoutManifest.of("long", engine.layout(131_000)), 1000)
    other = cost_model_for("qwen3-next-80b-a3b", "h20").model.cache.layout(1000)
    with pytest.raises(ManifestMismatch, match="layers"):
        engine.allocate(LayoutManifest.of("q", other), 16)
    assert engine.budget.used_bytes == 0
    ok = engine.allocate(LayoutManifest.of("ok", engine.layout(1000)), 16)
    assert ok.reserved_bytes == cm.kv_bytes(1016) == engine.budget.used_bytes


def test_scaled_manifest_is_checked_against_the_scaled_layout() -> None:
    engine = _engine(TimedConfig(byte_divisor=64))
    alloc = engine.allocate(LayoutManifest.of("s", engine.layout(4096, 1024)), 8)
    assert alloc.layout.num_bytes == engine.layout(4096, 1024).num_bytes
    with pytest.raises(ManifestMismatch):
        engine.allocate(LayoutManifest.of("u", engine.cache_spec.layout(4096, 1024)), 8)


async def test_several_emulated_nodes_share_one_loop() -> None:
    clock = LoopClock()
    cms = [cost_model_for("paper-1t", hw) for hw in ("h200", "h20", "h200")]
    engines = [
        TimedEngine(cm, LoopWaiter(clock), TimedConfig(time_scale=1e-4, byte_divisor=10**4))
        for cm in cms
    ]

    async def run(i: int, engine: TimedEngine) -> int:
        req = PrefillRequest(f"r{i}", tuple(range(8192)), SamplingParams(max_new_tokens=1))
        total = 0
        async for item in engine.prefill_stream(req):
            if isinstance(item, LayerOutput):
                total += item.num_bytes
        return total

    async with asyncio.timeout(30):
        totals = await asyncio.gather(*(run(i, e) for i, e in enumerate(engines)))
    assert totals[0] == totals[1] == totals[2] == engines[0].layout(8192).num_bytes


def test_engine_package_imports_no_torch() -> None:
    code = "import sys, prfaas.engine, prfaas.engine.timed; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def _lengths(engine: TimedEngine, sampling: SamplingParams, n: int) -> list[list[int]]:
    """Made-up tokens of ``n`` requests prefilled and decoded on one engine (chunks of 4)."""
    out = []
    for i in range(n):
        rid = f"s{i}"
        _, result = await _prefill(engine, PrefillRequest(rid, (1, 2, 3), sampling))
        alloc = engine.allocate(LayoutManifest.of(rid, engine.layout(3)), sampling.max_new_tokens)
        first = engine.install(alloc, result.first_token, sampling)
        tokens = list(first.token_ids)
        while not first.finished and engine.num_running:
            for ev in await engine.step_async():
                tokens.extend(ev.token_ids)
        out.append(tokens)
    return out


async def test_made_up_tokens_stop_on_stop_ids_only_after_min_tokens() -> None:
    """Half of the 128 made-up ids are stop ids: every request still gets min_tokens non-stop
    tokens, then ends at its first stop id (the event's last token), like the torch engine."""
    stops = tuple(range(0, 128, 2))
    engine = _engine(TimedConfig(token_chunk=4, vocab_size=128, byte_divisor=1000))
    free = SamplingParams(max_new_tokens=40, stop_token_ids=stops)
    held = SamplingParams(max_new_tokens=40, stop_token_ids=stops, min_tokens=6)
    for tokens in await _lengths(engine, held, 20):
        assert not set(tokens[:6]) & set(stops)
        assert tokens[-1] in stops and not set(tokens[6:-1]) & set(stops)
    early = await _lengths(engine, free, 20)
    assert min(len(t) for t in early) < 6  # without min_tokens, some stop sooner
    for tokens in early:
        assert tokens[-1] in stops and not set(tokens[:-1]) & set(stops)
    no_stops = SamplingParams(max_new_tokens=40, ignore_eos=False)  # no EOS here: full length
    assert {len(t) for t in await _lengths(engine, no_stops, 5)} == {40}
    assert engine.budget.used_bytes == 0 and engine.num_running == 0


async def test_kv_without_a_first_token_gets_the_one_the_prefill_would_have_drawn() -> None:
    """END carrying -1 (a vLLM prefill server samples none): the timed decode node draws the
    first token itself, from the request's own stream, so never relays -1."""
    sampling = SamplingParams(max_new_tokens=5)
    prefilled, unsampled = _engine(), _engine()
    _, result = await _prefill(prefilled, PrefillRequest("u", (1, 2, 3), sampling))
    alloc = unsampled.allocate(LayoutManifest.of("u", unsampled.layout(3)), 5)
    assert unsampled.install(alloc, -1, sampling).token_ids == (result.first_token,)
    assert result.first_token >= 0
