"""engine.torch, the "must hold" paths: every way of getting to the decode gives the tokens of
one-process generation, per architecture, in fp32 and in bf16 (compared with bf16)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_helpers import (
    ARCHS,
    BLOCK,
    DTYPES,
    GREEDY,
    NEW_TOKENS,
    PROMPT_TOKENS,
    assert_greedy_tokens,
    decode_all,
    prompt,
)

from prfaas.engine import (
    BudgetExceeded,
    LayerOutput,
    LayoutManifest,
    ManifestMismatch,
    PrefillRequest,
    PrefillResult,
    PromptTooLong,
    SamplingParams,
    UnknownRequest,
)
from prfaas.engine.torch import LoadedModel, TorchEngine, hf_cache
from prfaas.transfer import Link, Receiver, Refused, TransferConfig

CASES = [(a, d) for a in ARCHS for d in DTYPES]
Loaded = Callable[[str, str], LoadedModel]
Reference = Callable[..., list[int]]


def _copy_into(outputs: tuple[LayerOutput, ...], alloc_buffers: tuple[memoryview, ...]) -> None:
    for out, buf in zip(outputs, alloc_buffers, strict=True):
        for offset, view in out.pieces():
            buf[offset : offset + view.nbytes] = view


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("arch", "dtype"), CASES)
def test_joining_a_running_batch_midway(
    arch: str, dtype: str, loaded: Loaded, reference: Reference
) -> None:
    """(a) vs (e): three requests join a running batch at different steps, leave when done."""
    engine = TorchEngine(loaded(arch, dtype))
    tokens: dict[str, list[int]] = {}
    for seed in range(3):
        rid = f"r{seed}"
        result = engine.prefill(PrefillRequest(rid, prompt(seed), GREEDY))
        tokens[rid] = list(engine.start(result, GREEDY).token_ids)
        for _ in range(5):
            for ev in engine.step():
                tokens[ev.request_id].extend(ev.token_ids)
    decode_all(engine, tokens)
    for seed in range(3):
        rid, expected = f"r{seed}", reference(arch, dtype, seed)
        assert_greedy_tokens(loaded(arch, dtype), prompt(seed), tokens[rid], expected, rid)
    assert engine.budget.used_bytes == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("arch", "dtype"), CASES)
async def test_layerwise_transfer_in_memory(
    arch: str, dtype: str, loaded: Loaded, reference: Reference
) -> None:
    """(c): prefill streams each layer through prfaas.transfer as it is computed; the decode
    engine allocates on OPEN, installs the verified buffers and decodes."""
    model = loaded(arch, dtype)
    prefill_engine, decode_engine = TorchEngine(model), TorchEngine(model)
    allocations = {}

    def allocate(manifest):  # type: ignore[no-untyped-def]
        try:
            alloc = decode_engine.allocate(manifest, NEW_TOKENS)
        except (ManifestMismatch, BudgetExceeded, PromptTooLong) as exc:
            raise Refused(str(exc)) from None
        allocations[manifest.request_id] = alloc
        return list(alloc.layer_buffers)

    from prfaas.transfer import Manifest

    cfg = TransferConfig(psk=b"engine-test-key-0123456789", num_connections=2, chunk_bytes=4096)
    async with asyncio.timeout(60), Receiver(cfg, allocate) as rx:
        link = await Link.in_memory(rx, cfg)
        async with link:
            req = PrefillRequest("t", prompt(0), GREEDY)
            manifest = Manifest.from_layout("t", prefill_engine.layout(req.num_tokens))

            async def send() -> None:
                async with link.session(manifest) as session:
                    async for item in prefill_engine.prefill_stream(req):
                        if isinstance(item, LayerOutput):
                            for offset, view in item.pieces():
                                await session.send(item.position, offset, view)
                        else:
                            await session.finish(item.first_token)

            sender = asyncio.create_task(send())
            delivery = await (await rx.next_session()).complete()
            await sender
    with pytest.raises(UnknownRequest):
        prefill_engine.export("t")  # streamed out: the prefill node keeps nothing
    alloc = allocations["t"]
    tokens = {"t": list(decode_engine.install(alloc, delivery.first_token, GREEDY).token_ids)}
    decode_all(decode_engine, tokens)
    assert_greedy_tokens(model, prompt(0), tokens["t"], reference(arch, dtype), "layer-wise")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("arch", "dtype"), CASES)
def test_prefix_cache_start_and_incremental_transfer(
    arch: str, dtype: str, loaded: Loaded, reference: Reference
) -> None:
    """(d): the first 3 blocks come from a block checkpoint; only the suffix is prefilled; then
    only the suffix's full-attention KV + the final states cross to a node holding the prefix."""
    model = loaded(arch, dtype)
    first = TorchEngine(model)
    warm = first.prefill(PrefillRequest("warm", prompt(0), GREEDY, checkpoint_block_tokens=BLOCK))
    assert [c.num_tokens for c in warm.checkpoints] == [BLOCK, 2 * BLOCK, 3 * BLOCK]
    prefix = warm.checkpoints[-1]
    assert prefix.num_bytes == model.cmap.spec.bytes_for(3 * BLOCK)
    for small, big in zip(warm.checkpoints[0].layers, prefix.layers, strict=True):
        if small.segment.kind.grows_with_length:  # checkpoints share one KV export, no copies
            assert small.buffers[0].obj is big.buffers[0].obj
            assert bytes(small.buffers[0]) == bytes(big.buffers[0])[: small.buffers[0].nbytes]

    engine = TorchEngine(model)
    result = engine.prefill(PrefillRequest("p", prompt(0), GREEDY, cached=prefix))
    assert result.num_cached_tokens == 3 * BLOCK
    suffix = engine.export("p", num_cached_tokens=3 * BLOCK)
    assert sum(o.num_bytes for o in suffix) == model.cmap.spec.transfer_bytes(
        PROMPT_TOKENS, 3 * BLOCK
    )
    tokens = {"p": list(engine.start(result, GREEDY).token_ids)}
    decode_all(engine, tokens)
    assert_greedy_tokens(model, prompt(0), tokens["p"], reference(arch, dtype), "prefix start")

    decoder = TorchEngine(model)
    layout = decoder.layout(PROMPT_TOKENS, 3 * BLOCK)
    alloc = decoder.allocate(LayoutManifest.of("i", layout), NEW_TOKENS)
    _copy_into(suffix, alloc.layer_buffers)
    tokens = {
        "i": list(decoder.install(alloc, result.first_token, GREEDY, prefix=prefix).token_ids)
    }
    decode_all(decoder, tokens)
    expected = reference(arch, dtype)
    assert_greedy_tokens(model, prompt(0), tokens["i"], expected, "incremental onto a prefix")


@pytest.mark.timeout(180)
def test_prefill_in_another_process(
    model_dirs: dict[str, Path], loaded: Loaded, reference: Reference, tmp_path: Path
) -> None:
    """(b): a separate process prefills and exports every case; this one imports and decodes."""
    worker = Path(__file__).with_name("engine_prefill_worker.py")
    cases = [f"{a}:{d}:{model_dirs[a]}" for a, d in CASES]
    subprocess.run(
        [sys.executable, str(worker), str(tmp_path), str(PROMPT_TOKENS), str(NEW_TOKENS), *cases],
        check=True,
        timeout=150,
        capture_output=True,
    )
    for arch, dtype in CASES:
        engine = TorchEngine(loaded(arch, dtype))
        data = memoryview((tmp_path / f"{arch}-{dtype}.bin").read_bytes())
        first = json.loads((tmp_path / f"{arch}-{dtype}.json").read_text())["first_token"]
        alloc = engine.allocate(LayoutManifest.of("xp", engine.layout(PROMPT_TOKENS)), NEW_TOKENS)
        offset = 0
        for buf in alloc.layer_buffers:
            buf[:] = data[offset : offset + buf.nbytes]
            offset += buf.nbytes
        assert offset == data.nbytes
        tokens = {"xp": list(engine.install(alloc, first, GREEDY).token_ids)}
        decode_all(engine, tokens)
        model = loaded(arch, dtype)
        assert_greedy_tokens(model, prompt(0), tokens["xp"], reference(arch, dtype), arch + dtype)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arch", ["qwen3_next", "llama"])
def test_seeded_sampling_is_reproducible(arch: str, loaded: Loaded, reference: Reference) -> None:
    sampling = SamplingParams(
        max_new_tokens=NEW_TOKENS, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True
    )
    alone = reference(arch, "fp32", 0, sampling)
    engine = TorchEngine(loaded(arch, "fp32"))
    tokens: dict[str, list[int]] = {}
    for rid, seed in (("other", 1), ("s", 0)):
        result = engine.prefill(PrefillRequest(rid, prompt(seed), sampling))
        tokens[rid] = list(engine.start(result, sampling).token_ids)
        for ev in engine.step():
            tokens[ev.request_id].extend(ev.token_ids)
    decode_all(engine, tokens)
    assert tokens["s"] == alone
    other_seed = SamplingParams(
        max_new_tokens=NEW_TOKENS, temperature=0.8, top_p=0.9, seed=8, ignore_eos=True
    )
    assert reference(arch, "fp32", 0, other_seed) != alone
    assert alone != reference(arch, "fp32", 0)  # sampling, not greedy


@pytest.mark.timeout(60)
@pytest.mark.parametrize("arch", ["qwen3_next", "kimi_linear", "bamba"])
async def test_layer_i_is_handed_out_before_layer_i_plus_1_runs(arch: str, loaded: Loaded) -> None:
    """Layer i+1 of the model is held at its start until the consumer has layer i's output: if
    outputs were handed out only at the end, the wait would time out."""
    import threading

    model = loaded(arch, "fp32")
    engine = TorchEngine(model)
    layers = hf_cache.decoder_layers(model.model)
    positions = {m: p for p, m in enumerate(model.cmap.model_layers)}
    received = {p: threading.Event() for p in positions.values()}
    log: list[str] = []
    timeouts: list[int] = []

    def gate(m: int) -> Callable[..., None]:
        def pre_hook(_module: object, _args: object) -> None:
            prev = max((p for mm, p in positions.items() if mm < m), default=None)
            if prev is not None and not received[prev].wait(timeout=10):
                timeouts.append(m)
            log.append(f"start {m}")

        return pre_hook

    handles = [layer.register_forward_pre_hook(gate(m)) for m, layer in enumerate(layers)]
    try:
        async with asyncio.timeout(60):
            async for item in engine.prefill_stream(PrefillRequest("l", prompt(0), GREEDY)):
                if isinstance(item, LayerOutput):
                    log.append(f"out {item.position}")
                    received[item.position].set()
                else:
                    assert isinstance(item, PrefillResult)
    finally:
        for h in handles:
            h.remove()
    assert timeouts == []
    for m, p in positions.items():
        if m + 1 < len(layers):
            assert log.index(f"out {p}") < log.index(f"start {m + 1}")


@pytest.mark.timeout(60)
def test_the_tie_rule_still_rejects_a_wrong_token(loaded: Loaded, reference: Reference) -> None:
    """assert_greedy_tokens lets a bf16 tie go either way, not a token the model would not pick."""
    model, expected = loaded("llama", "bf16"), reference("llama", "bf16")
    wrong = list(expected)
    wrong[10] = (wrong[10] + 1) % model.vocab_size
    with pytest.raises(AssertionError, match="not a greedy choice"):
        assert_greedy_tokens(model, prompt(0), wrong, expected, "wrong token")
