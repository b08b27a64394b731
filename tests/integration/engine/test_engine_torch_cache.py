"""engine.torch: the hybrid cache round trip per architecture, and clear refusals of bad input."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import ARCHS, EXTRA_ARCHS, GREEDY, NEW_TOKENS, PROMPT_TOKENS, prompt

from prfaas.cli import main as cli_main
from prfaas.engine import (
    BudgetExceeded,
    EngineError,
    FinishReason,
    LayoutManifest,
    ManifestMismatch,
    ModelFolderError,
    PrefillRequest,
    PromptTooLong,
    SamplingParams,
    UnknownArchitecture,
    UnknownRequest,
)
from prfaas.engine.torch import LoadedModel, TorchEngine, load_model
from prfaas.engine.torch.export import import_cache, split_layer_buffer
from prfaas.errors import UsageError
from prfaas.spec import DType, LayerKind
from prfaas.transfer import Manifest

Loaded = Callable[[str, str], LoadedModel]
Reference = Callable[..., list[int]]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("arch", [*ARCHS, *EXTRA_ARCHS])
def test_cache_round_trip_matches_the_spec(arch: str, dtype: str, loaded: Loaded) -> None:
    """Export follows CacheSpec.layout exactly (kinds, shapes, dtype per tensor: recurrent states
    fp32 in bf16 models); import gives back the very same tensors."""
    model = loaded(arch, dtype)
    engine = TorchEngine(model)
    engine.prefill(PrefillRequest("r", prompt(0), GREEDY))
    outputs = engine.export("r")
    layout = model.cmap.spec.layout(PROMPT_TOKENS)
    assert tuple(o.segment for o in outputs) == layout.segments
    for out, seg in zip(outputs, layout.segments, strict=True):
        assert [b.nbytes for b in out.buffers] == [t.num_bytes for t in seg.tensors]
        for t in seg.tensors:
            want = DType.FP32 if t.name == "recurrent_state" else DType.parse(dtype)
            assert t.dtype is want, (seg.layer_index, t.name)
    assert sum(o.num_bytes for o in outputs) == model.cmap.spec.bytes_for(PROMPT_TOKENS)
    if arch == "mistral":
        assert {s.kind for s in layout.segments} == {LayerKind.SWA}
    buffers = tuple(
        split_layer_buffer(layout, pos, memoryview(b"".join(bytes(b) for b in out.buffers)))
        for pos, out in enumerate(outputs)
    )
    rebuilt = import_cache(model.cmap, layout, buffers, None, model.cmap.max_context_tokens)
    original = engine._held["r"].cache
    for got, want in zip(rebuilt.layers, original.layers, strict=True):
        assert got.keys() == want.keys()
        for name in got:
            assert got[name].dtype == want[name].dtype
            assert torch.equal(got[name], want[name]), name


def test_unknown_architecture(tmp_path: Path, model_dirs: dict[str, Path]) -> None:
    folder = tmp_path / "gpt2"
    shutil.copytree(model_dirs["llama"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": "gpt2"}))
    with pytest.raises(UnknownArchitecture, match=r"'gpt2'.*qwen3_next"):
        load_model(folder)
    assert issubclass(UnknownArchitecture, UsageError)


def test_cli_make_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["model", "make-tiny", "--arch", "gpt2", "--out", str(tmp_path / "x")]) == 2
    assert "unknown architecture 'gpt2'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert cli_main(["model", "make-tiny", "--arch", "llama", "--out", str(tmp_path / "l")]) == 0
    engine = TorchEngine.from_folder(tmp_path / "l")
    assert len(engine.generate(PrefillRequest("c", prompt(0, 20), GREEDY))) == NEW_TOKENS
    assert cli_main(["model", "info", str(tmp_path / "l")]) == 0
    assert "gqa" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("model.safetensors", "safetensors"),
        ("tokenizer.json", "tokenizer"),
        ("config.json", "config"),
    ],
)
def test_model_folder_missing_files(
    tmp_path: Path, model_dirs: dict[str, Path], missing: str, message: str
) -> None:
    folder = tmp_path / "m"
    shutil.copytree(model_dirs["llama"], folder)
    (folder / missing).unlink()
    with pytest.raises(ModelFolderError, match=message):
        load_model(folder)
    with pytest.raises(ModelFolderError, match="does not exist"):
        load_model(tmp_path / "nowhere")


def _manifest_with(layout_manifest: Manifest, pos: int, **changes: object) -> Manifest:
    layers = list(layout_manifest.layers)
    layers[pos] = dataclasses.replace(layers[pos], **changes)
    return dataclasses.replace(layout_manifest, layers=tuple(layers))


def test_mismatched_manifests_are_refused_and_nothing_is_held(loaded: Loaded) -> None:
    engine = TorchEngine(loaded("qwen3_next", "fp32"))
    good = Manifest.from_layout("m", engine.layout(PROMPT_TOKENS))
    llama = Manifest.from_layout("m", loaded("llama", "fp32").cmap.spec.layout(PROMPT_TOKENS))
    bf16 = Manifest.from_layout("m", loaded("qwen3_next", "bf16").cmap.spec.layout(PROMPT_TOKENS))
    state = good.layers[0].tensors[0]
    wrong_shape = _manifest_with(
        good, 0, tensors=(dataclasses.replace(state, shape=(4, 16, 8)), *good.layers[0].tensors[1:])
    )
    fewer = dataclasses.replace(good, layers=good.layers[:-1])
    kind = _manifest_with(good, 0, kind=LayerKind.SWA)
    cases = [
        (fewer, "3 layers"),
        (llama, "kind gqa, expected linear"),
        (kind, "kind swa"),
        (bf16, "dtype bf16, expected fp32"),
        (wrong_shape, r"shape \(4, 16, 8\), expected \(4, 16, 16\)"),
    ]
    for manifest, message in cases:
        with pytest.raises(ManifestMismatch, match=message):
            engine.allocate(manifest, NEW_TOKENS)
    assert engine.budget.used_bytes == 0
    alloc = engine.allocate(good, NEW_TOKENS)  # the same id is free again: nothing half-held
    assert alloc.reserved_bytes == engine.cache_spec.bytes_for(PROMPT_TOKENS + NEW_TOKENS)


def test_install_with_a_wrong_prefix_releases_everything(loaded: Loaded) -> None:
    model = loaded("qwen3_next", "fp32")
    engine = TorchEngine(model)
    alloc = engine.allocate(LayoutManifest.of("p", engine.layout(PROMPT_TOKENS, 128)), NEW_TOKENS)
    with pytest.raises(ManifestMismatch, match="cached prefix of 128 tokens, got none"):
        engine.install(alloc, 1, GREEDY)
    assert engine.budget.used_bytes == 0 and engine.num_running == 0
    warm = engine.prefill(PrefillRequest("w", prompt(0), GREEDY, checkpoint_block_tokens=64))
    alloc = engine.allocate(LayoutManifest.of("p", engine.layout(PROMPT_TOKENS, 128)), NEW_TOKENS)
    with pytest.raises(ManifestMismatch, match="got 64 tokens"):
        engine.install(alloc, 1, GREEDY, prefix=warm.checkpoints[0])
    assert engine.budget.used_bytes == 0 and engine.num_running == 0


def test_prompt_too_long(loaded: Loaded) -> None:
    model = loaded("llama", "fp32")
    engine = TorchEngine(model)
    limit = model.cmap.max_context_tokens
    with pytest.raises(PromptTooLong, match=f"maximum of {limit}"):
        engine.prefill(PrefillRequest("long", prompt(0, limit), GREEDY))
    with pytest.raises(PromptTooLong):
        engine.allocate(LayoutManifest.of("long", engine.layout(limit - 8)), NEW_TOKENS)
    assert engine.budget.used_bytes == 0
    with pytest.raises(UnknownRequest):
        engine.export("long")
    with pytest.raises(EngineError, match="token id 9999"):
        engine.prefill(PrefillRequest("bad", (1, 2, 9999), GREEDY))


def test_kv_budget_overflow_is_refused_cleanly(loaded: Loaded) -> None:
    model = loaded("llama", "fp32")
    one = model.cmap.spec.bytes_for(PROMPT_TOKENS + NEW_TOKENS)
    engine = TorchEngine(model, kv_budget_bytes=one + one // 2)
    first = engine.prefill(PrefillRequest("a", prompt(0), GREEDY))
    engine.start(first, GREEDY)
    second = engine.prefill(PrefillRequest("b", prompt(1), GREEDY))
    with pytest.raises(BudgetExceeded, match=f"needs {one} KV bytes"):
        engine.start(second, GREEDY)
    with pytest.raises(BudgetExceeded):
        engine.allocate(LayoutManifest.of("c", engine.layout(PROMPT_TOKENS)), NEW_TOKENS)
    assert engine.running_ids() == ("a",) and engine.budget.used_bytes == one
    engine.export("b")  # still held, intact: the refusal changed nothing
    engine.release("a")
    engine.start(second, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    assert engine.running_ids() == ("b",)


def test_stop_tokens_eos_and_one_token_requests(loaded: Loaded, reference: Reference) -> None:
    model = loaded("llama", "fp32")
    full = reference("llama", "fp32")
    stop_at = next(i for i in range(3, NEW_TOKENS) if full[i] not in full[:i])
    sampling = SamplingParams(
        max_new_tokens=NEW_TOKENS, ignore_eos=True, stop_token_ids=(full[stop_at],)
    )
    engine = TorchEngine(model)
    assert engine.generate(PrefillRequest("s", prompt(0), sampling)) == full[: stop_at + 1]
    assert engine.num_running == 0 and engine.budget.used_bytes == 0
    one = SamplingParams(max_new_tokens=1, ignore_eos=True)
    event = engine.start(engine.prefill(PrefillRequest("one", prompt(0), one)), one)
    assert event.token_ids == (full[0],) and event.finish_reason is FinishReason.LENGTH
    assert engine.num_running == 0 and engine.budget.used_bytes == 0
    # EOS stops a request unless it is ignored: the model's EOS joins the stop set.
    eos = SamplingParams(max_new_tokens=NEW_TOKENS)
    engine.start(engine.prefill(PrefillRequest("eos", prompt(0), eos)), eos)
    assert set(model.eos_token_ids) <= engine._running["eos"].stop_ids
    engine.release("eos")


def test_prefix_from_another_model_is_refused(loaded: Loaded) -> None:
    other = TorchEngine(loaded("llama", "fp32"))
    warm = other.prefill(PrefillRequest("w", prompt(0), GREEDY, checkpoint_block_tokens=64))
    engine = TorchEngine(loaded("qwen3_next", "fp32"))
    with pytest.raises(ManifestMismatch, match="kind gqa, expected linear"):
        engine.prefill(PrefillRequest("p", prompt(0), GREEDY, cached=warm.checkpoints[0]))
    with pytest.raises(UnknownRequest):
        engine.export("p")  # nothing half-held


async def test_prefill_stream_raises_errors_on_the_awaiting_side(loaded: Loaded) -> None:
    engine = TorchEngine(loaded("llama", "fp32"))
    limit = engine.max_context_tokens
    with pytest.raises(PromptTooLong):
        async for _ in engine.prefill_stream(PrefillRequest("x", prompt(0, limit), GREEDY)):
            pass
