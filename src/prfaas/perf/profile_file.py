"""Profile files: the versioned YAML format of a measured (or shipped) cost profile.

A profile file says which model and hardware it was measured for, holds the measured points
(prefill time over new and cached prompt tokens, decode step time over batch and context; each a
median over repeats with its spread), the model's cache layout (KV bytes per token and fixed
state) and how it was measured. ``ProfileFile.to_profile()`` turns it into the ``Profile`` the
``CostModel`` reads (``perf.profile_costs.cost_model_from_profile_file`` does the whole way from a
path); ``shipped_profiles`` reads the package's own profile files. The schema is documented in
docs/profiles.md; ``SCHEMA_VERSION`` is the only version read.

Pure apart from the explicit file reads and writes of ``load_profile_file`` / ``dump_profile_file``
(PyYAML imports neither asyncio nor torch): no clock, no network.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import nnls  # type: ignore[import-untyped]

from prfaas.perf.curves import PiecewiseLinearCurve, PolynomialCurve
from prfaas.perf.profiles import (
    SHIPPED_PROFILE_NAMES,
    DecodeFit,
    DecodeProfile,
    Profile,
    shipped_profile_text,
)
from prfaas.spec.cache_spec import CacheSpec, LayerCache, LayerKind, TensorSpec
from prfaas.spec.dtype import DType
from prfaas.spec.hardware import HardwareSpec
from prfaas.spec.model_spec import ModelSpec

SCHEMA_VERSION = 1
PREFILL_CURVES = ("piecewise-linear", "polynomial")
DECODE_MODELS = ("slo-constant", "linear")


class ProfileFileError(ValueError):
    """A profile file that cannot be used; the message is one line naming the problem."""


# -- the measured points ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PrefillPoint:
    """One prefill: ``new_tokens`` computed after ``cached_tokens`` taken from a prefix cache."""

    new_tokens: int
    cached_tokens: int
    median_s: float
    """Median over the repeats (the value the curve goes through)."""
    spread_s: float | None = None
    """Max minus min over the repeats (None: not known, e.g. a paper's table)."""
    repeats: int | None = None


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """One decode step of ``batch`` requests each holding ``context_tokens`` tokens."""

    batch: int
    context_tokens: int
    """Per request (the step's total context is ``batch * context_tokens``)."""
    median_s: float
    spread_s: float | None = None
    repeats: int | None = None


@dataclass(frozen=True, slots=True)
class PrefillSection:
    curve: str
    """``piecewise-linear`` through the uncached points' medians, or ``polynomial``."""
    points: tuple[PrefillPoint, ...] = ()
    """Every measured point; cached ones are kept as checks of the cost model's cached rule."""
    coefficients: tuple[float, ...] = ()
    """``polynomial`` only: seconds = c0 + c1*l + c2*l^2 ..."""


@dataclass(frozen=True, slots=True)
class DecodeSection:
    model: str
    """``slo-constant`` (flat ``step_s`` up to ``max_batch``, the paper's) or ``linear`` (a
    non-negative least-squares fit of step = base + per_request*batch + per_token*context)."""
    step_s: float | None = None
    max_batch: int | None = None
    points: tuple[DecodePoint, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelSection:
    name: str
    cache: CacheSpec | None = None
    """The per-layer cache (absent for a preset: the preset's is used)."""
    params: float | None = None
    active_params: float | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    attention_head_dim: int | None = None
    weight_bytes_per_param: float | None = None
    max_context_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class HardwareSection:
    name: str
    memory_bytes_per_instance: float | None = None
    """Memory of the instance measured (sizes KV budgets when the hardware is not a preset)."""


@dataclass(frozen=True, slots=True)
class ProfileFile:
    model: ModelSection
    hardware: HardwareSection
    prefill: PrefillSection | None
    """None: prefill timing from the roofline of a preset hardware."""
    decode: DecodeSection | None
    measured_with: tuple[tuple[str, str], ...] = ()
    """How it was measured (``source``: preset | torch | endpoint, device, URL, ...)."""
    note: str = ""
    origin: str = ""
    """Where it was read from (a path or ``preset:<name>``); not written."""

    @property
    def label(self) -> str:
        """What a ``CostModel`` built from this file reports as its source."""
        return f"profile-file:{self.origin or self.model.name + '@' + self.hardware.name}"

    def to_profile(self, label: str | None = None) -> Profile:
        """The ``Profile`` the cost model reads; ``label`` None keeps the built-in naming."""
        return Profile(
            self.model.name,
            self.hardware.name,
            _prefill_curve(self.prefill) if self.prefill is not None else None,
            _decode_model(self.decode) if self.decode is not None else None,
            self.note,
            label,
        )


# -- building the cost model's pieces --------------------------------------------------------------
def _prefill_curve(section: PrefillSection) -> PiecewiseLinearCurve | PolynomialCurve:
    if section.curve == "polynomial":
        return PolynomialCurve(section.coefficients)
    uncached = sorted((p.new_tokens, p.median_s) for p in section.points if p.cached_tokens == 0)
    if len(uncached) < 2 or len({n for n, _ in uncached}) != len(uncached):
        raise ProfileFileError(
            "prefill.points: a piecewise-linear curve needs at least two uncached points "
            "(cached_tokens 0) of distinct new_tokens"
        )
    return PiecewiseLinearCurve.of(uncached)


def fit_decode(points: Sequence[DecodePoint]) -> DecodeFit:
    """Non-negative least squares of step = base + per_request*batch + per_token*total context.

    Non-negative so the step never shrinks with a larger batch or context (the closed-form span
    of the cost model assumes that); relative residuals, so short steps weigh as much as long.
    """
    rows = np.array([[1.0, p.batch, p.batch * p.context_tokens] for p in points])
    y = np.array([p.median_s for p in points])
    scale = 1.0 / y
    coef, _ = nnls(rows * scale[:, None], y * scale)
    base, per_request, per_token = (float(c) for c in coef)
    if base + per_request <= 0:
        raise ProfileFileError("decode.points: the fitted step time of one request is 0")
    return DecodeFit(base, per_request, per_token, f"least-squares fit over {len(points)} points")


def _decode_model(section: DecodeSection) -> DecodeProfile | DecodeFit:
    if section.model == "slo-constant":
        assert section.step_s is not None and section.max_batch is not None  # checked on read
        return DecodeProfile(section.step_s, section.max_batch, "slo-constant from profile file")
    if len(section.points) < 3:
        raise ProfileFileError("decode.points: a linear decode model needs at least 3 points")
    return fit_decode(section.points)


def model_spec_for(pf: ProfileFile, model: ModelSpec | str | None) -> ModelSpec:
    from prfaas.spec.presets import get_model, model_names

    if isinstance(model, ModelSpec):
        spec = model
    elif isinstance(model, str):
        try:
            spec = get_model(model)
        except KeyError as exc:
            # Not a preset (a torch or vLLM deployment's served name): the file's own model, when
            # it was measured for that name and describes it.
            if pf.model.cache is None or model.lower() != pf.model.name.lower():
                raise ProfileFileError(exc.args[0]) from None
            spec = _spec_from_section(pf.model)
    elif pf.model.cache is None:
        if pf.model.name.lower() not in {n.lower() for n in model_names()}:
            raise ProfileFileError(
                f"{pf.origin}: model {pf.model.name!r} is not a preset and the file has no "
                "model.cache: name the model"
            )
        return get_model(pf.model.name)
    else:
        return _spec_from_section(pf.model)
    if spec.name.lower() != pf.model.name.lower():
        raise ProfileFileError(
            f"{pf.origin}: the profile was measured for model {pf.model.name!r}, not {spec.name!r}"
        )
    return spec


def _spec_from_section(m: ModelSection) -> ModelSpec:
    assert m.cache is not None
    missing = [
        n
        for n in ("params", "hidden_size", "num_attention_heads", "attention_head_dim")
        if getattr(m, n) is None
    ]
    if missing:
        raise ProfileFileError(f"model: missing field(s) {', '.join(missing)}")
    assert m.params is not None and m.hidden_size is not None
    assert m.num_attention_heads is not None and m.attention_head_dim is not None
    return ModelSpec(
        m.name,
        m.cache,
        m.params,
        m.active_params if m.active_params is not None else m.params,
        m.hidden_size,
        m.num_attention_heads,
        m.attention_head_dim,
        m.weight_bytes_per_param if m.weight_bytes_per_param is not None else 2.0,
        m.max_context_tokens if m.max_context_tokens is not None else 131072,
        source="profile file",
    )


def hardware_spec_for(pf: ProfileFile) -> HardwareSpec:
    from prfaas.spec.presets import get_hardware, hardware_names

    name = pf.hardware.name
    if name.lower() in hardware_names():
        return get_hardware(name)
    if pf.prefill is None or pf.decode is None:
        raise ProfileFileError(
            f"{pf.origin}: hardware {name!r} is not a preset, so the file must measure both "
            "prefill and decode (there is no roofline to fall back on)"
        )
    memory = pf.hardware.memory_bytes_per_instance
    if memory is None:
        raise ProfileFileError(f"{pf.origin}: hardware.memory_bytes_per_instance is missing")
    # FLOP/s and HBM figures are never read: every timing comes from the file (checked above).
    return HardwareSpec(name, 1.0, 1.0, memory, gpus_per_instance=1, source=pf.label)


# -- reading ---------------------------------------------------------------------------------
class _Reader:
    """Typed field access that names the field in every error."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def _fail(self, key: str, what: str) -> ProfileFileError:
        return ProfileFileError(f"{self.where}{key}: {what}")

    def get(self, key: str, kind: type | tuple[type, ...], required: bool = True) -> Any:
        if key not in self.data or self.data[key] is None:
            if required:
                raise self._fail(key, "missing")
            return None
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            names = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            raise self._fail(key, f"must be {names}, got {value!r}")
        return value

    def number(self, key: str, required: bool = True, positive: bool = True) -> float | None:
        value = self.get(key, (int, float), required)
        if value is None:
            return None
        if not math.isfinite(value) or (value <= 0 if positive else value < 0):
            raise self._fail(key, f"must be a {'positive' if positive else 'non-negative'} "
                             f"finite number, got {value!r}")  # fmt: skip
        return float(value)

    def count(self, key: str, required: bool = True, minimum: int = 1) -> int | None:
        value = self.get(key, int, required)
        if value is not None and value < minimum:
            raise self._fail(key, f"must be an integer >= {minimum}, got {value!r}")
        return value  # type: ignore[no-any-return]

    def section(self, key: str, required: bool = True) -> _Reader | None:
        value = self.get(key, dict, required)
        return None if value is None else _Reader(value, f"{self.where}{key}.")

    def items(self, key: str) -> list[_Reader]:
        value = self.get(key, list, required=False) or []
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise self._fail(f"{key}[{i}]", f"must be a mapping, got {item!r}")
            out.append(_Reader(item, f"{self.where}{key}[{i}]."))
        return out


def _spread(r: _Reader) -> float | None:
    return r.number("spread_s", required=False, positive=False)


def _read_prefill(r: _Reader) -> PrefillSection:
    curve = r.get("curve", str)
    if curve not in PREFILL_CURVES:
        raise ProfileFileError(f"{r.where}curve: must be one of {', '.join(PREFILL_CURVES)}, "
                               f"got {curve!r}")  # fmt: skip
    points = tuple(
        PrefillPoint(
            p.count("new_tokens"),  # type: ignore[arg-type]
            p.count("cached_tokens", minimum=0),  # type: ignore[arg-type]
            p.number("median_s"),  # type: ignore[arg-type]
            _spread(p),
            p.count("repeats", required=False),
        )
        for p in r.items("points")
    )
    coefficients: tuple[float, ...] = ()
    if curve == "polynomial":
        raw = r.get("coefficients", list)
        if not raw or any(isinstance(c, bool) or not isinstance(c, int | float) for c in raw):
            raise ProfileFileError(f"{r.where}coefficients: must be a list of numbers")
        coefficients = tuple(float(c) for c in raw)
    section = PrefillSection(curve, points, coefficients)
    _prefill_curve(section)  # a bad set of points is an error of the file, named on read
    return section


def _read_decode(r: _Reader) -> DecodeSection:
    model = r.get("model", str)
    if model not in DECODE_MODELS:
        raise ProfileFileError(f"{r.where}model: must be one of {', '.join(DECODE_MODELS)}, "
                               f"got {model!r}")  # fmt: skip
    points = tuple(
        DecodePoint(
            p.count("batch"),  # type: ignore[arg-type]
            p.count("context_tokens", minimum=0),  # type: ignore[arg-type]
            p.number("median_s"),  # type: ignore[arg-type]
            _spread(p),
            p.count("repeats", required=False),
        )
        for p in r.items("points")
    )
    if model == "slo-constant":
        section = DecodeSection(model, r.number("step_s"), r.count("max_batch"), points)
    else:
        section = DecodeSection(model, None, None, points)
    _decode_model(section)
    return section


def _read_tensor(r: _Reader) -> TensorSpec:
    shape = r.get("shape", list)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ProfileFileError(f"{r.where}shape: must be a list of positive integers")
    try:
        return TensorSpec(r.get("name", str), tuple(shape), DType.parse(r.get("dtype", str)))
    except ValueError as exc:
        raise ProfileFileError(f"{r.where}dtype: {exc}") from None


def _read_cache(r: _Reader) -> CacheSpec:
    layers = []
    for layer in r.items("layers"):
        try:
            kind = LayerKind(layer.get("kind", str))
            layers.append(
                LayerCache(
                    kind,
                    tuple(_read_tensor(t) for t in layer.items("per_token")),
                    tuple(_read_tensor(t) for t in layer.items("fixed")),
                    layer.count("window_tokens", required=False),
                )
            )
        except ValueError as exc:
            if isinstance(exc, ProfileFileError):
                raise
            raise ProfileFileError(f"{layer.where[:-1]}: {exc}") from None
    if not layers:
        raise ProfileFileError(f"{r.where}layers: missing")
    return CacheSpec(tuple(layers))


def _read_model(r: _Reader) -> ModelSection:
    cache = r.section("cache", required=False)
    return ModelSection(
        r.get("name", str),
        _read_cache(cache) if cache is not None else None,
        r.number("params", required=False),
        r.number("active_params", required=False),
        r.count("hidden_size", required=False),
        r.count("num_attention_heads", required=False),
        r.count("attention_head_dim", required=False),
        r.number("weight_bytes_per_param", required=False),
        r.count("max_context_tokens", required=False),
    )


def profile_file_from_dict(data: Any, origin: str) -> ProfileFile:
    """Validate a parsed document; every error names its field (``prefill.points[2].median_s``)."""
    if not isinstance(data, dict):
        raise ProfileFileError(f"{origin}: not a profile file (a YAML mapping is expected)")
    version = data.get("version")
    if version != SCHEMA_VERSION:
        raise ProfileFileError(
            f"{origin}: unsupported profile version {version!r} (this prfaas reads version "
            f"{SCHEMA_VERSION})"
        )
    r = _Reader(data, f"{origin}: ")
    model = r.section("model")
    hardware = r.section("hardware")
    assert model is not None and hardware is not None
    prefill = r.section("prefill", required=False)
    decode = r.section("decode", required=False)
    measured = r.get("measured_with", dict, required=False) or {}
    return ProfileFile(
        _read_model(model),
        HardwareSection(hardware.get("name", str), hardware.number("memory_bytes_per_instance",
                                                                   required=False)),
        _read_prefill(prefill) if prefill is not None else None,
        _read_decode(decode) if decode is not None else None,
        tuple((str(k), str(v)) for k, v in measured.items()),
        r.get("note", str, required=False) or "",
        origin,
    )  # fmt: skip


def load_profile_file(path: Path) -> ProfileFile:
    """Read and validate the profile at ``path``; ``ProfileFileError`` names what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ProfileFileError(f"cannot read profile file {path}: {reason}") from None
    return load_profile_text(text, str(path))


def load_profile_text(text: str, origin: str) -> ProfileFile:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ProfileFileError(f"{origin}: not valid YAML ({first})") from None
    return profile_file_from_dict(data, origin)


# -- writing ---------------------------------------------------------------------------------
def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None and v != () and v != []}


def _tensor_dict(t: TensorSpec) -> dict[str, Any]:
    return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype.value}


def cache_to_dict(cache: CacheSpec) -> dict[str, Any]:
    layers = [
        _drop_none(
            {
                "kind": la.kind.value,
                "per_token": [_tensor_dict(t) for t in la.per_token] or None,
                "fixed": [_tensor_dict(t) for t in la.fixed] or None,
                "window_tokens": la.window_tokens,
            }
        )
        for la in cache.layers
    ]
    return {
        # Summary for readers; the reader derives both again from ``layers``.
        "full_attention_bytes_per_token": cache.full_attention_bytes_per_token,
        "fixed_bytes": cache.fixed_bytes,
        "layers": layers,
    }


def profile_file_to_dict(pf: ProfileFile) -> dict[str, Any]:
    m = pf.model
    model = _drop_none(
        {
            "name": m.name,
            "params": m.params,
            "active_params": m.active_params,
            "hidden_size": m.hidden_size,
            "num_attention_heads": m.num_attention_heads,
            "attention_head_dim": m.attention_head_dim,
            "weight_bytes_per_param": m.weight_bytes_per_param,
            "max_context_tokens": m.max_context_tokens,
            "cache": cache_to_dict(m.cache) if m.cache is not None else None,
        }
    )
    out: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "model": model,
        "hardware": _drop_none(
            {
                "name": pf.hardware.name,
                "memory_bytes_per_instance": pf.hardware.memory_bytes_per_instance,
            }
        ),
        "measured_with": {str(k): str(v) for k, v in pf.measured_with},
        "note": pf.note,
        "prefill": None,
        "decode": None,
    }  # fmt: skip
    if pf.prefill is not None:
        out["prefill"] = _drop_none(
            {
                "curve": pf.prefill.curve,
                "coefficients": list(pf.prefill.coefficients) or None,
                "points": [_drop_none(_point_dict(p)) for p in pf.prefill.points] or None,
            }
        )
    if pf.decode is not None:
        out["decode"] = _drop_none(
            {
                "model": pf.decode.model,
                "step_s": pf.decode.step_s,
                "max_batch": pf.decode.max_batch,
                "points": [_drop_none(_point_dict(p)) for p in pf.decode.points] or None,
            }
        )
    return out


def _point_dict(p: PrefillPoint | DecodePoint) -> dict[str, Any]:
    return {name: getattr(p, name) for name in p.__slots__}


def dump_profile_text(pf: ProfileFile) -> str:
    header = (
        f"# prfaas profile, schema version {SCHEMA_VERSION} (docs/profiles.md).\n"
        "# prefill: null / decode: null mean the roofline of the (preset) hardware answers.\n"
    )
    return header + yaml.safe_dump(profile_file_to_dict(pf), sort_keys=False, width=100)


def dump_profile_file(pf: ProfileFile, path: Path) -> None:
    """Write ``pf`` to ``path`` (through a temporary file: never a half-written profile)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dump_profile_text(pf), encoding="utf-8")
    tmp.replace(path)


PROFILE_FILE_SUFFIXES = (".yaml", ".yml")


def is_profile_file(hardware: str) -> bool:
    """A deployment's ``hardware`` names a profile file (else a hardware preset)."""
    return hardware.endswith(PROFILE_FILE_SUFFIXES)


_SHIPPED: dict[tuple[str, str], Profile] = {}


def shipped_profiles() -> dict[tuple[str, str], Profile]:
    """Every shipped profile by (model, hardware), read from the package's files once."""
    if not _SHIPPED:
        for name in SHIPPED_PROFILE_NAMES:
            pf = load_profile_text(shipped_profile_text(name), f"preset:{name}")
            _SHIPPED[(pf.model.name, pf.hardware.name)] = pf.to_profile()
    return _SHIPPED


def find_profile(model: str, hardware: str) -> Profile | None:
    """The shipped profile of (model, hardware), or None (the cost model uses the roofline)."""
    return shipped_profiles().get((model, hardware))
