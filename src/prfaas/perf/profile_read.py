"""Reading a profile file: the YAML document checked field by field into a ``ProfileFile``.

Every error is a ``ProfileFileError`` whose one line names the field
(``prefill.points[2].median_s``); a set of points the cost model could not use is an error of
the file, named on read. Also reads the package's shipped profiles (``shipped_profiles``,
``find_profile``), once. The format itself is ``perf.profile_file``; writing is
``perf.profile_write``.

Pure apart from the explicit file read of ``load_profile_file`` and the shipped files (PyYAML
imports neither asyncio nor torch): no clock, no network.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from prfaas.perf.plumbing import LEGACY_TERMS, PLUMBING_TERMS, SIGNED_TERMS, PlumbingCosts
from prfaas.perf.profile_file import (
    DECODE_MODELS,
    PREFILL_CURVES,
    READ_VERSIONS,
    DecodePoint,
    DecodeSection,
    HardwareSection,
    ModelSection,
    PrefillPoint,
    PrefillSection,
    ProfileFile,
    ProfileFileError,
    decode_model,
    prefill_curve,
)
from prfaas.perf.profiles import SHIPPED_PROFILE_NAMES, Profile, shipped_profile_text
from prfaas.spec.cache_spec import CacheSpec, LayerCache, LayerKind, TensorSpec
from prfaas.spec.dtype import DType


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

    def number(
        self, key: str, required: bool = True, positive: bool = True, above: float | None = None
    ) -> float | None:
        """``key``'s number: positive, else (``positive=False``) non-negative, else (``above``)
        greater than ``above``; finite always."""
        value = self.get(key, (int, float), required)
        if value is None:
            return None
        if above is not None:
            if not math.isfinite(value) or value <= above:
                raise self._fail(key, f"must be a finite number above {above:g}, got {value!r}")
        elif not math.isfinite(value) or (value <= 0 if positive else value < 0):
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
    prefill_curve(section)  # a bad set of points is an error of the file, named on read
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
    decode_model(section)
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
    if isinstance(version, bool) or version not in READ_VERSIONS:
        raise ProfileFileError(
            f"{origin}: unsupported profile version {version!r} (this prfaas reads versions "
            f"{', '.join(map(str, READ_VERSIONS))})"
        )
    r = _Reader(data, f"{origin}: ")
    model = r.section("model")
    hardware = r.section("hardware")
    assert model is not None and hardware is not None
    prefill = r.section("prefill", required=False)
    decode = r.section("decode", required=False)
    measured = r.get("measured_with", dict, required=False) or {}
    plumbing_section = r.section("plumbing", required=False) if version >= 2 else None
    plumbing, how = _read_plumbing(plumbing_section)
    return ProfileFile(
        _read_model(model),
        HardwareSection(hardware.get("name", str), hardware.number("memory_bytes_per_instance",
                                                                   required=False)),
        _read_prefill(prefill) if prefill is not None else None,
        _read_decode(decode) if decode is not None else None,
        tuple((str(k), str(v)) for k, v in measured.items()),
        r.get("note", str, required=False) or "",
        origin,
        plumbing,
        how,
    )  # fmt: skip


def _read_plumbing(r: _Reader | None) -> tuple[PlumbingCosts, tuple[tuple[str, str], ...]]:
    """The ``plumbing`` section: each term a non-negative number of seconds (per request, per
    KV byte or per output token) or a ratio (``RATIO_TERMS``; a ``SIGNED_TERMS`` one above -1);
    a term left out (or the whole section) is missing. An older
    profile's term (``LEGACY_TERMS``) gives the terms that replaced it its value, unless the
    file has them too; they are ``approximated``."""
    if r is None:
        return PlumbingCosts(), ()
    unknown = sorted(set(r.data) - {*PLUMBING_TERMS, *LEGACY_TERMS, "how"})
    if unknown:
        raise ProfileFileError(f"{r.where}{unknown[0]}: unknown plumbing term (known: "
                               f"{', '.join(PLUMBING_TERMS)})")  # fmt: skip
    values = {n: r.number(n, required=False, positive=False,
                          above=-1.0 if n in SIGNED_TERMS else None)
              for n in PLUMBING_TERMS}  # fmt: skip
    measured = {n: v for n, v in values.items() if v is not None}
    approximated: list[str] = []
    for old, new in LEGACY_TERMS.items():
        value = r.number(old, required=False, positive=False)
        if value is None:
            continue
        for name in new:
            if name not in measured:
                measured[name] = value
                approximated.append(name)
    missing = tuple(n for n in PLUMBING_TERMS if n not in measured)
    how = r.get("how", dict, required=False) or {}
    return PlumbingCosts(**measured, missing=missing, approximated=tuple(approximated)), tuple(
        (str(k), str(v)) for k, v in how.items()
    )


def load_profile_file(path: Path) -> ProfileFile:
    """Read and validate the profile at ``path``; ``ProfileFileError`` names what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ProfileFileError(f"cannot read profile file {path}: {reason}") from None
    return load_profile_text(text, str(path))


def load_profile_text(text: str, origin: str) -> ProfileFile:
    """The profile of YAML ``text`` (``origin`` names it in errors). Memoised on the text: a
    capacity search or a bench builds hundreds of simulators from the same files, and parsing
    the YAML was most of their set-up (a ``ProfileFile`` is frozen, so sharing one is safe)."""
    return _load_profile_text(text, origin)


@functools.lru_cache(maxsize=64)
def _load_profile_text(text: str, origin: str) -> ProfileFile:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ProfileFileError(f"{origin}: not valid YAML ({first})") from None
    return profile_file_from_dict(data, origin)


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
