"""Profile files: the versioned YAML format of a measured (or shipped) cost profile.

A profile file says which model and hardware it was measured for, holds the measured points
(prefill time over new and cached prompt tokens, decode step time over batch and context; each a
median over repeats with its spread), the model's cache layout (KV bytes per token and fixed
state) and how it was measured. This module owns the format as typed sections and what they
mean: ``ProfileFile.to_profile()`` turns it into the ``Profile`` the ``CostModel`` reads, and
``model_spec_for`` / ``hardware_spec_for`` the specs it describes
(``perf.profile_costs.cost_model_from_profile_file`` does the whole way from a path). Reading
and checking a document is ``perf.profile_read`` (which also reads the package's shipped
profiles), writing one ``perf.profile_write``. The schema is documented in docs/profiles.md;
``SCHEMA_VERSION`` (2) is written; ``READ_VERSIONS`` are read (a version-1 file has no
``plumbing`` section: every plumbing term is missing, and the loader warns once naming them).

Pure: no I/O, no clock, no network; imports neither the reader nor the writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prfaas.perf.curves import PiecewiseLinearCurve, PolynomialCurve
from prfaas.perf.plumbing import NO_PLUMBING, PlumbingCosts
from prfaas.perf.prefill_fit import fit_prefill
from prfaas.perf.profiles import DecodeFit, DecodeProfile, Profile
from prfaas.spec.cache_spec import CacheSpec
from prfaas.spec.hardware import HardwareSpec
from prfaas.spec.model_spec import ModelSpec

SCHEMA_VERSION = 2
READ_VERSIONS = (1, 2)
"""Version 2 added the optional ``plumbing`` section (the live system's costs around the
forward passes, ``perf.plumbing``); a version-1 file reads as measuring none of them."""
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
    """Every measured point; cached ones measure what a prefix adds (``perf.prefill_fit``: the
    cost model's fit per pass, per token and per attended pair is over all of them)."""
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
    plumbing: PlumbingCosts = NO_PLUMBING
    """The measured plumbing terms (``missing`` names those the file lacks)."""
    plumbing_how: tuple[tuple[str, str], ...] = ()
    """Per measured term, how it was measured (written as the section's ``how``)."""

    @property
    def label(self) -> str:
        """What a ``CostModel`` built from this file reports as its source."""
        return f"profile-file:{self.origin or self.model.name + '@' + self.hardware.name}"

    def to_profile(self, label: str | None = None) -> Profile:
        """The ``Profile`` the cost model reads; ``label`` None keeps the built-in naming."""
        fit = None
        if self.prefill is not None and self.prefill.curve == "piecewise-linear":
            passes = dict(self.measured_with).get("pass_tokens")
            fit = fit_prefill(self.prefill.points, int(passes) if passes else None)
        return Profile(
            self.model.name,
            self.hardware.name,
            prefill_curve(self.prefill) if self.prefill is not None else None,
            decode_model(self.decode) if self.decode is not None else None,
            self.note,
            label,
            fit,
        )


# -- building the cost model's pieces --------------------------------------------------------------
def prefill_curve(section: PrefillSection) -> PiecewiseLinearCurve | PolynomialCurve:
    """The prefill curve of ``section``; ``ProfileFileError`` if its points cannot make one."""
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
    # Imported here, not at the top: every prfaas process reads its deployment file through this
    # module, and scipy.optimize costs ~0.6 s of start-up that only a fit needs.
    from scipy.optimize import nnls  # type: ignore[import-untyped]

    rows = np.array([[1.0, p.batch, p.batch * p.context_tokens] for p in points])
    y = np.array([p.median_s for p in points])
    scale = 1.0 / y
    coef, _ = nnls(rows * scale[:, None], y * scale)
    base, per_request, per_token = (float(c) for c in coef)
    note = f"least-squares fit over {len(points)} points"
    if base + per_request <= 0:
        # Few or noisy points (a --quick grid on a loaded core: CI, 2026-12-07) can be fitted by
        # the context term alone, a step with no fixed cost: wrong for any engine, and the
        # cost model's closed forms need a one-request step above 0. Fit without that term.
        coef, _ = nnls(rows[:, :2] * scale[:, None], y * scale)
        base, per_request, per_token = float(coef[0]), float(coef[1]), 0.0
        note += (" without the context term (with it the fit gave a one-request step no fixed "
                 "cost: too few or too noisy points)")  # fmt: skip
    if base + per_request <= 0:
        raise ProfileFileError("decode.points: the fitted step time of one request is 0")
    return DecodeFit(base, per_request, per_token, note)


def decode_model(section: DecodeSection) -> DecodeProfile | DecodeFit:
    """The decode model of ``section``; ``ProfileFileError`` if its points cannot make one."""
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


PROFILE_FILE_SUFFIXES = (".yaml", ".yml")


def is_profile_file(hardware: str) -> bool:
    """A deployment's ``hardware`` names a profile file (else a hardware preset)."""
    return hardware.endswith(PROFILE_FILE_SUFFIXES)
