"""engine.timed batches prefills and admits decodes with the simulator's ``policy/`` objects:
for the same arrivals it forms the same prefill batches at the same times as ``sim.Simulator``,
and joins decodes in the same order at the same step boundaries. The engine runs on an event
loop whose clock jumps to the next timer (exact, no wall time), so concurrent requests interleave
as they would on the wall clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jumping_clock import run_virtual
from prfaas.core.clock import LoopClock
from prfaas.engine import LayoutManifest, PrefillRequest, SamplingParams
from prfaas.engine.timed import PrefillBatchStart, TimedConfig, TimedEngine
from prfaas.engine.waiting import LoopWaiter
from prfaas.perf import cost_model_for_hardware
from prfaas.sim import Simulator
from prfaas.sim.request import SimRequest
from prfaas.sim.scenario import SimScenario, SimSite
from prfaas.workload import SimRequestSpec

pytestmark = pytest.mark.timeout(60)


def _sim(specs: list[SimRequestSpec], **kw: Any) -> list[SimRequest]:
    sc = SimScenario(
        sites=(SimSite("pd", "pd", "h20", num_prefill=1, num_decode=1),),
        policy="local_only",
        prefix_cache=False,
        tune=False,
        output_tokens=specs[0].num_output_tokens,
        **kw,
    )
    sim = Simulator(sc, iter(specs))
    done: list[SimRequest] = []
    sim.on_finish = done.append
    sim.run()
    assert len(done) == len(specs)
    return sorted(done, key=lambda r: r.index)


def _engine(**kw: Any) -> TimedEngine:
    cm = cost_model_for_hardware("paper-1t", "h20")
    loop = asyncio.get_running_loop()
    return TimedEngine(cm, LoopWaiter(LoopClock(source=loop.time)), TimedConfig(**kw))


# Prompts long and short, arriving faster than one H20 prefills them: batches of one to several.
PROMPTS = (9000, 1200, 800, 20000, 3000, 3000, 600, 14000, 900, 700, 26000, 2500, 1800, 400)
ARRIVALS = tuple(0.05 + 0.21 * i for i in range(len(PROMPTS)))


@pytest.mark.parametrize("token_budget", [32768, 8192])
def test_prefill_batches_are_the_simulators(token_budget: int) -> None:
    specs = [
        SimRequestSpec(i, t, n, 4) for i, (t, n) in enumerate(zip(ARRIVALS, PROMPTS, strict=True))
    ]
    sim_batches: dict[float, list[str]] = {}
    for r in _sim(specs, prefill_token_budget=token_budget):
        sim_batches.setdefault(r.prefill_start_s, []).append(f"r{r.index}")
    expected = sorted((start, tuple(ids)) for start, ids in sim_batches.items())

    got: list[PrefillBatchStart] = []

    async def main() -> None:
        engine = _engine(prefill_token_budget=token_budget)
        engine.on_prefill_batch = got.append

        async def one(spec: SimRequestSpec) -> None:
            await asyncio.sleep(spec.arrival_s)
            req = PrefillRequest(
                f"r{spec.index}", tuple(range(spec.num_prompt_tokens)), SamplingParams()
            )
            async for _ in engine.prefill_stream(req):
                pass

        await asyncio.gather(*(one(s) for s in specs))

    run_virtual(main())
    assert [b.request_ids for b in got] == [ids for _, ids in expected]
    assert [b.start_s for b in got] == pytest.approx([s for s, _ in expected], rel=1e-9)
    assert max(len(b.request_ids) for b in got) >= 3  # batching happened, not one by one


def test_prefill_layers_follow_the_batch_and_an_abandoned_member_keeps_its_slot() -> None:
    """Members hand out layer i at (i+1)/L of the batch; a member abandoned mid-batch does not
    move the next batch's start; one abandoned while queued never takes the instance."""
    starts: list[PrefillBatchStart] = []

    async def main() -> None:
        engine = _engine()
        engine.on_prefill_batch = starts.append
        n_layers = engine.cache_spec.num_layers
        seen: dict[str, list[float]] = {}

        async def one(rid: str, at_s: float, n: int, stop_after: int | None) -> None:
            await asyncio.sleep(at_s)
            req = PrefillRequest(rid, tuple(range(n)), SamplingParams())
            stream = engine.prefill_stream(req)
            async for _ in stream:
                seen.setdefault(rid, []).append(engine.waiter.clock.now())
                if stop_after is not None and len(seen[rid]) == stop_after:
                    await stream.aclose()
                    return

        async def queued_then_gone() -> None:
            await asyncio.sleep(0.2)
            req = PrefillRequest("gone", tuple(range(5000)), SamplingParams())
            stream = engine.prefill_stream(req)
            task = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await stream.aclose()

        await asyncio.gather(
            one("a", 0.0, 8000, None),
            one("b", 0.1, 2000, None),
            one("c", 0.1, 3000, 2),
            queued_then_gone(),
        )
        first, second = starts
        assert first.request_ids == ("a",) and second.request_ids == ("b", "c")
        assert second.start_s == pytest.approx(first.start_s + first.duration_s)
        assert seen["b"][-2] == pytest.approx(second.start_s + second.duration_s)  # last layer
        assert seen["b"][0] == pytest.approx(second.start_s + second.duration_s / n_layers)
        assert len(seen["b"]) == n_layers + 1  # every layer, then the result

    run_virtual(main())
    assert len(starts) == 2  # "gone" never started


def test_decode_joins_are_the_simulators() -> None:
    """Forty requests whose KV reaches one H20 decode node (BS_max 20) as the simulator has it:
    the engine admits them in the simulator's order at the simulator's step boundaries."""
    n_out = 60
    specs = [SimRequestSpec(i, 0.02 * i, 500 + 37 * i, n_out) for i in range(40)]
    sim = _sim(specs)
    assert max(r.decode_start_s - r.kv_ready_s for r in sim) > 0  # some had to wait

    joined: dict[str, float] = {}

    async def main() -> None:
        engine = _engine(token_chunk=1, byte_divisor=1000)
        assert engine.max_batch == 20
        wake = asyncio.Event()

        async def arrive(r: SimRequest) -> None:
            await asyncio.sleep(r.kv_ready_s)
            rid = f"r{r.index}"
            # The simulator's request makes num_output decode steps after its first token.
            alloc = engine.allocate(LayoutManifest.of(rid, engine.layout(r.num_prompt)), n_out + 1)
            engine.install(alloc, 1, SamplingParams(max_new_tokens=n_out + 1))
            wake.set()

        async def decode_loop() -> None:  # the worker's loop
            while len(joined) < len(sim) or engine.num_running:
                if engine.num_running == 0:
                    wake.clear()
                    await wake.wait()
                    continue
                start = engine.waiter.clock.now()
                engine.next_decode_plan()  # admits at this step boundary
                for rid in engine._running:
                    joined.setdefault(rid, start)
                await engine.step_async()

        await asyncio.gather(decode_loop(), *(arrive(r) for r in sim))

    run_virtual(main())
    sim_order = [f"r{r.index}" for r in sorted(sim, key=lambda r: (r.decode_start_s, r.index))]
    assert sorted(joined, key=lambda rid: (joined[rid], int(rid[1:]))) == sim_order
    for r in sim:
        assert joined[f"r{r.index}"] == pytest.approx(r.decode_start_s, rel=2e-3, abs=2e-3)


def test_decode_admission_memory_and_batch_limits() -> None:
    async def main() -> None:
        engine = _engine(max_batch=2, token_chunk=1, byte_divisor=1000)
        for rid in ("a", "b", "c"):
            alloc = engine.allocate(LayoutManifest.of(rid, engine.layout(1000)), 3)
            engine.install(alloc, 1, SamplingParams(max_new_tokens=3))
        assert (engine.num_batched, engine.num_waiting, engine.num_running) == (0, 3, 3)
        await engine.step_async()
        assert (engine.num_batched, engine.num_waiting) == (2, 1)  # BS_max 2: c waits
        await engine.step_async()  # a and b finish (3 tokens)
        assert (engine.num_batched, engine.num_waiting) == (0, 1)
        await engine.step_async()
        assert engine.num_batched == 1
        # KV share: a batch of one holds more than the share; the next waits for it.
        small = _engine(decode_kv_fraction=1e-5, token_chunk=1, byte_divisor=1000)
        for rid in ("x", "y"):
            alloc = small.allocate(LayoutManifest.of(rid, small.layout(4000)), 2)
            small.install(alloc, 1, SamplingParams(max_new_tokens=2))
        assert small.decode_kv_capacity_bytes < small.cost_model.kv_bytes(4002)
        await small.step_async()
        assert (small.num_batched, small.num_waiting) == (0, 1)  # x ran alone, and finished
        await small.step_async()
        assert (small.num_batched, small.num_running) == (0, 0)

    run_virtual(main())


def test_a_batch_starting_as_a_queued_request_is_abandoned_passes_it_by() -> None:
    """A queued request's wait cancelled (its client gone, say: a decode node died) cancels its
    future at once, but it leaves the queue only when its task next runs. Another request's
    stream closed in that same step ends the running batch and starts the next one: it must pass
    the abandoned request by, not set its future (InvalidStateError, which left the node with no
    batch running and every later prefill queued for ever: seen in a soak with a killed decode
    node). A later request is prefilled as usual."""

    async def main() -> None:
        engine = _engine()
        running = engine.prefill_stream(PrefillRequest("a", tuple(range(8000)), SamplingParams()))
        await running.__anext__()  # "a" holds the instance, mid-batch
        queued = engine.prefill_stream(PrefillRequest("b", tuple(range(2000)), SamplingParams()))
        waiting = asyncio.ensure_future(queued.__anext__())
        await asyncio.sleep(0)  # "b" waits in the queue for its batch
        waiting.cancel()  # its future is cancelled now; its own cleanup runs later
        await running.aclose()  # "a" abandoned in the same step: its batch ends, the next starts
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await queued.aclose()
        later = engine.prefill_stream(PrefillRequest("c", tuple(range(1000)), SamplingParams()))
        outputs = [out async for out in later]
        assert len(outputs) == engine.cache_spec.num_layers + 1  # every layer, then the result

    run_virtual(main())
