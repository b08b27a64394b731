"""Profile files: the shipped profiles round-trip, measured points build the cost model, and every
kind of bad file is a one-line ``ProfileFileError`` naming the problem."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prfaas.perf import cost_model_for
from prfaas.perf.profile_costs import cost_model_from_profile_file
from prfaas.perf.profile_file import (
    DecodePoint,
    DecodeSection,
    HardwareSection,
    ModelSection,
    PrefillPoint,
    PrefillSection,
    ProfileFile,
    ProfileFileError,
)
from prfaas.perf.profile_read import load_profile_file, load_profile_text
from prfaas.perf.profile_write import dump_profile_file
from prfaas.perf.profiles import SHIPPED_PROFILE_NAMES, shipped_profile_text
from prfaas.spec import get_model

LENGTHS = (128, 1000, 5000, 19628, 60000, 131072)


@pytest.mark.parametrize("name", SHIPPED_PROFILE_NAMES)
def test_shipped_profile_round_trips_through_a_file(name: str, tmp_path: Path) -> None:
    shipped = load_profile_text(shipped_profile_text(name), f"preset:{name}")
    path = tmp_path / f"{name}.yaml"
    dump_profile_file(shipped, path)
    again = load_profile_file(path)
    assert again.to_profile() == shipped.to_profile()
    model, hardware = name.split("@")
    built_in = cost_model_for(model, hardware)
    from_file = cost_model_from_profile_file(path)
    for length in LENGTHS:
        assert from_file.prefill_s(length) == built_in.prefill_s(length)
        assert from_file.prefill_s(length, 4096) == built_in.prefill_s(length, 4096)
    for batch in (1, 20, 64):
        assert from_file.decode_step_s(batch, batch * 8192) == built_in.decode_step_s(
            batch, batch * 8192
        )
    assert from_file.max_decode_batch == built_in.max_decode_batch
    assert from_file.prefill_source == f"profile-file:{path}"
    assert built_in.prefill_source == f"profile:{name}"
    # What the file does not measure still comes from the preset hardware's roofline.
    if shipped.decode is None:
        assert from_file.decode_source == f"roofline:{hardware}"


def _measured(tmp_path: Path) -> ProfileFile:
    spec = get_model("paper-1t")
    prefill = tuple(
        PrefillPoint(n, c, 0.01 + 1e-5 * n + 2e-6 * c, 0.001, 3)
        for n, c in ((64, 0), (256, 0), (1024, 0), (256, 256))
    )
    # An exact linear decode: the fit must recover it.
    decode = tuple(
        DecodePoint(b, ctx, 0.002 + 0.0005 * b + 1e-7 * b * ctx, 0.0, 5)
        for b in (1, 2, 4, 8)
        for ctx in (128, 1024)
    )
    return ProfileFile(
        ModelSection("tiny", spec.cache, 1e6, 1e6, 64, 4, 16, 4.0, 2048),
        HardwareSection("cpu-test", 8e9),
        PrefillSection("piecewise-linear", prefill),
        DecodeSection("linear", points=decode),
        (("source", "torch"), ("device", "cpu")),
        "test",
    )


def test_measured_profile_builds_its_own_model_and_hardware(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    dump_profile_file(_measured(tmp_path), path)
    cost = cost_model_from_profile_file(path)
    assert cost.model.name == "tiny"
    assert cost.model.cache == get_model("paper-1t").cache
    assert cost.kv_bytes(1000) == get_model("paper-1t").cache.bytes_for(1000)
    assert cost.hardware.instance_memory_bytes == 8e9
    assert cost.prefill_s(256) == pytest.approx(0.01 + 1e-5 * 256)
    assert cost.decode_step_s(4, 4 * 500) == pytest.approx(0.002 + 0.0005 * 4 + 1e-7 * 2000)
    assert cost.decode_span_s(2, 100, 10) == pytest.approx(
        sum(cost.decode_step_s(2, 100 + 2 * k) for k in range(10))
    )
    assert cost.decode_source == cost.prefill_source == f"profile-file:{path}"
    assert load_profile_file(path).measured_with == (("source", "torch"), ("device", "cpu"))


def test_a_model_other_than_the_profiled_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    dump_profile_file(_measured(tmp_path), path)
    with pytest.raises(ProfileFileError, match="measured for model 'tiny', not 'paper-1t'"):
        cost_model_from_profile_file(path, "paper-1t")


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _good() -> dict[str, object]:
    return yaml.safe_load(shipped_profile_text("paper-1t@h200"))  # type: ignore[no-any-return]


def _edit(change: str) -> dict[str, object]:
    data: dict[str, object] = _good()
    prefill = data["prefill"]
    assert isinstance(prefill, dict)
    if change == "version":
        data["version"] = 3
    elif change == "no-model":
        del data["model"]
    elif change == "no-median":
        del prefill["points"][1]["median_s"]
    elif change == "negative":
        prefill["points"][2]["median_s"] = -1.0
    elif change == "curve":
        prefill["curve"] = "spline"
    elif change == "one-point":
        prefill["points"] = prefill["points"][:1]
    elif change == "hardware":
        data["hardware"] = {"name": "my-gpu"}
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("version", "unsupported profile version 3"),
        ("no-model", "model: missing"),
        ("no-median", r"prefill\.points\[1\]\.median_s: missing"),
        ("negative", r"prefill\.points\[2\]\.median_s: must be a positive finite number"),
        ("curve", "prefill.curve: must be one of piecewise-linear, polynomial"),
        ("one-point", "needs at least two uncached points"),
        ("hardware", "hardware 'my-gpu' is not a preset"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path: Path, change: str, message: str) -> None:
    path = _write(tmp_path, _edit(change))
    with pytest.raises(ProfileFileError, match=message) as info:
        cost_model_from_profile_file(path)
    assert "\n" not in str(info.value)


def test_unreadable_and_not_yaml(tmp_path: Path) -> None:
    with pytest.raises(ProfileFileError, match=r"cannot read profile file .*missing\.yaml"):
        load_profile_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: [1\n", encoding="utf-8")
    with pytest.raises(ProfileFileError, match="not valid YAML"):
        load_profile_file(bad)
    bad.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ProfileFileError, match="not a profile file"):
        load_profile_file(bad)


def test_profile_warns_where_a_longer_prompt_timed_faster() -> None:
    """``prfaas profile`` names each pair of uncached lengths where the longer one timed faster
    (a busy core: the curve extended past its points would carry it to every longer prompt);
    cached points and rising pairs are not named."""
    from types import SimpleNamespace

    from prfaas.commands.profile import _falling_prefill

    def point(new: int, cached: int, s: float) -> SimpleNamespace:
        return SimpleNamespace(new_tokens=new, cached_tokens=cached, median_s=s)

    pf = SimpleNamespace(prefill=SimpleNamespace(points=(
        point(128, 0, 0.020), point(1024, 0, 0.010), point(2048, 0, 0.030),
        point(64, 512, 0.001),
    )))  # fmt: skip
    (warning,) = _falling_prefill(pf)
    assert warning.startswith("prefill of 1024 tokens timed 10 ms, of 128 tokens 20 ms")
    assert _falling_prefill(SimpleNamespace(prefill=None)) == []
