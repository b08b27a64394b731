"""Layer-wise hand-out during a chunked prefill: every pass hands out its new full-attention KV
rows (``LayerOutput.rows``) as each layer finishes, states after the last pass; what a receiver
assembles is byte for byte the one-shot prefill's cache, the tokens decoded from it are the
reference's, and the prefix checkpoints are unchanged. A hybrid (qwen3_next) and a dense (llama)
tiny model, fp32, with and without checkpoints; also through the node worker's re-slicing for a
receiver holding more or less of the prefix than the prefill node reused, and through
prfaas.transfer (digest verified) with checkpoints on, as nodes run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from engine_helpers import BLOCK, GREEDY, NEW_TOKENS, decode_all, prompt

from prfaas.engine import LayerOutput, PrefillRequest, PrefillResult
from prfaas.engine.api import CachedPrefix
from prfaas.engine.torch import LoadedModel, TorchEngine
from prfaas.engine.torch.export import export_cache
from prfaas.engine.torch.prefill import PrefilledCache, PrefillJob
from prfaas.serve.node.kv_pieces import pieces_for_receiver
from prfaas.spec import CacheLayout
from prfaas.transfer import Link, Manifest, Receiver, TransferConfig

Loaded = Callable[[str, str], LoadedModel]
Reference = Callable[..., list[int]]
ARCHS = ("qwen3_next", "llama")
CHUNK = 48  # not a divisor of BLOCK: passes end on chunk and on block boundaries


def _run(
    model: LoadedModel, req: PrefillRequest, chunk: int | None
) -> tuple[list[LayerOutput], PrefilledCache, list[int]]:
    """A prefill cut into passes of ``chunk`` tokens (as while requests decode): its outputs in
    hand-out order, its end state, and how many outputs had come out when each pass ended."""
    outs: list[LayerOutput] = []
    job = PrefillJob(model, req, 4096, chunk, outs.append)
    marks = []
    while not job.done:
        job.run_chunk(split=True)
        marks.append(len(outs))
    return outs, job.result(), marks


def _whole(model: LoadedModel, end: PrefilledCache, receiver_tokens: int) -> list[bytes]:
    """The same passes' cache exported in one go after the prefill (the hand-out before parts).
    Not a one-pass prefill's: cutting a linear layer's scan changes its float rounding."""
    outs = export_cache("ref", model.cmap, end.cache, receiver_tokens)
    return [b"".join(bytes(b) for b in out.buffers) for out in outs]


def _assemble(
    outs: list[LayerOutput], layout: CacheLayout, cached: CachedPrefix | None = None
) -> list[bytes]:
    """Each layer as the receiver of ``layout`` gets it, every byte written exactly once."""
    bufs = [bytearray(seg.num_bytes) for seg in layout.segments]
    written = [bytearray(seg.num_bytes) for seg in layout.segments]
    for out in outs:
        target = layout.segments[out.position]
        for offset, view in pieces_for_receiver(out, cached, target, layout.num_cached_tokens):
            end = offset + view.nbytes
            assert not any(written[out.position][offset:end]), f"layer {out.position}: overlap"
            bufs[out.position][offset:end] = view
            written[out.position][offset:end] = b"\1" * view.nbytes
    for pos, w in enumerate(written):
        assert all(w), f"layer {pos}: bytes missing"
    return [bytes(b) for b in bufs]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("block", [None, BLOCK])
def test_chunked_handout_is_the_one_shot_cache(
    arch: str, block: int | None, loaded: Loaded
) -> None:
    model = loaded(arch, "fp32")
    req = PrefillRequest("c", prompt(0), GREEDY, checkpoint_block_tokens=block)
    outs, end, marks = _run(model, req, CHUNK)
    layout = model.cmap.spec.layout(req.num_tokens, 0)
    assert _assemble(outs, layout) == _whole(model, end, 0)
    # Early: the first pass already handed out every full-attention layer's first rows.
    full = [p for p, s in enumerate(layout.segments) if s.kind.grows_with_length]
    first_pass = outs[: marks[0]]
    assert sorted(o.position for o in first_pass) == full
    assert all(o.rows == (0, min(CHUNK, block or CHUNK)) for o in first_pass)
    assert all(o.rows is None for o in outs if not o.segment.kind.grows_with_length)
    # The hand-out leaves the checkpoints as a prefill without it takes them.
    if block is None:
        return
    quiet = PrefillJob(model, req, 4096, CHUNK, None)
    while not quiet.done:
        quiet.run_chunk(split=True)
    want_checkpoints = quiet.result().checkpoints
    assert [c.num_tokens for c in end.checkpoints] == [BLOCK * i for i in (1, 2, 3)]
    assert [c.num_tokens for c in want_checkpoints] == [BLOCK * i for i in (1, 2, 3)]
    for got, want in zip(end.checkpoints, want_checkpoints, strict=True):
        for a, b in zip(got.layers, want.layers, strict=True):
            assert a.segment == b.segment
            assert [bytes(x) for x in a.buffers] == [bytes(x) for x in b.buffers]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("receiver_blocks", [0, 2])
def test_chunked_handout_from_a_stored_prefix(
    arch: str, receiver_blocks: int, loaded: Loaded
) -> None:
    """The prefill node reuses 1 block; the receiver holds 0 (stored rows go first) or 2 blocks
    (rows it holds are dropped from the parts): the worker's pieces still rebuild it exactly."""
    model = loaded(arch, "fp32")
    ids = prompt(1)
    _, first, _ = _run(model, PrefillRequest("p", ids, GREEDY, None, BLOCK), None)
    cached = first.checkpoints[0]
    assert cached.num_tokens == BLOCK
    req = PrefillRequest("s", ids, GREEDY, cached=cached, checkpoint_block_tokens=BLOCK)
    outs, end, marks = _run(model, req, CHUNK)
    assert len(marks) > 2
    receiver_tokens = receiver_blocks * BLOCK
    layout = model.cmap.spec.layout(req.num_tokens, receiver_tokens)
    assert _assemble(outs, layout, cached) == _whole(model, end, receiver_tokens)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("arch", ARCHS)
async def test_chunked_stream_through_transfer_decodes_the_reference(
    arch: str, loaded: Loaded, reference: Reference
) -> None:
    """Checkpoints on (the live default), a request decoding meanwhile (so passes are cut at
    ``CHUNK`` too): the parts cross prfaas.transfer, the receiver verifies the session's digest,
    installs and decodes the reference's tokens."""
    model = loaded(arch, "fp32")
    prefill_engine = TorchEngine(model, prefill_chunk_tokens=CHUNK)
    decode_engine = TorchEngine(model)
    allocations = {}

    def allocate(manifest: Manifest) -> list[memoryview]:
        alloc = decode_engine.allocate(manifest, NEW_TOKENS)
        allocations[manifest.request_id] = alloc
        return list(alloc.layer_buffers)

    busy = prefill_engine.prefill(PrefillRequest("busy", prompt(2), GREEDY))
    prefill_engine.start(busy, GREEDY)
    cfg = TransferConfig(psk=b"engine-test-key-0123456789", num_connections=2, chunk_bytes=4096)
    req = PrefillRequest("t", prompt(0), GREEDY, checkpoint_block_tokens=BLOCK)
    parts = 0
    try:
        async with asyncio.timeout(50), Receiver(cfg, allocate) as rx:
            link = await Link.in_memory(rx, cfg)
            async with link:
                manifest = Manifest.from_layout("t", prefill_engine.layout(req.num_tokens))
                result: PrefillResult | None = None

                async def send() -> None:
                    nonlocal result, parts
                    async with link.session(manifest) as session:
                        async for item in prefill_engine.prefill_stream(req):
                            if isinstance(item, LayerOutput):
                                parts += item.rows is not None
                                for offset, view in item.pieces():
                                    await session.send(item.position, offset, view)
                            else:
                                result = item
                        assert result is not None
                        await session.finish(result.first_token)

                async def steps() -> None:  # keep the busy request decoding: passes get cut
                    while prefill_engine.num_running:
                        await prefill_engine.step_async()

                sender = asyncio.create_task(send())
                stepper = asyncio.create_task(steps())
                delivery = await (await rx.next_session()).complete()
                await sender
                await stepper
        assert result is not None and len(result.checkpoints) == req.num_tokens // BLOCK
        assert parts > 0
        tokens = {
            "t": list(
                decode_engine.install(allocations["t"], delivery.first_token, GREEDY).token_ids
            )
        }
        decode_all(decode_engine, tokens)
        assert tokens["t"] == reference(arch, "fp32")
    finally:
        prefill_engine.close()
        decode_engine.close()
