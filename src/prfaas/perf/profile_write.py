"""Writing a profile file: a ``ProfileFile`` as the YAML document ``perf.profile_read`` reads.

Fields that are not known (None, empty) are left out; the cache's summary figures are written
for readers only (the reader derives them again from the layers). The format itself is
``perf.profile_file``.

Pure apart from the explicit file write of ``dump_profile_file``: no clock, no network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from prfaas.perf.plumbing import LEGACY_TERMS, PLUMBING_TERMS
from prfaas.perf.profile_file import SCHEMA_VERSION, DecodePoint, PrefillPoint, ProfileFile
from prfaas.spec.cache_spec import CacheSpec, TensorSpec


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
    plumbing = pf.plumbing
    measured = [n for n in PLUMBING_TERMS
                if n not in plumbing.missing and n not in plumbing.approximated]  # fmt: skip
    if measured or plumbing.approximated:  # left out when nothing was measured
        section: dict[str, Any] = {n: getattr(plumbing, n) for n in measured}
        for old, new in LEGACY_TERMS.items():
            # Written back as it was read, so a rewritten file still says it was not split.
            if any(n in plumbing.approximated for n in new):
                section[old] = getattr(plumbing, new[0])
        if pf.plumbing_how:
            section["how"] = {str(k): str(v) for k, v in pf.plumbing_how}
        out["plumbing"] = section
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
