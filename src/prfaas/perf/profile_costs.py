"""Cost models built from profile files: ``cost_model_from_profile_file`` (a path),
``cost_model_from`` (an already read ``ProfileFile``) and ``cost_model_for_hardware`` (what a
deployment's ``hardware`` names: a preset or a profile file). Its own module so that
``profile_file`` (the format) and ``profile_read`` do not import ``cost_model``, which reads the
shipped profiles through ``profile_read``. The only I/O is the profile file read when asked for,
and one warning per file (logger ``prfaas.perf``) naming the plumbing terms it did not measure.
"""

from __future__ import annotations

import logging
from pathlib import Path

from prfaas.perf.cost_model import CostModel, cost_model_for
from prfaas.perf.profile_file import ProfileFile, hardware_spec_for, is_profile_file, model_spec_for
from prfaas.perf.profile_read import load_profile_file
from prfaas.spec.model_spec import ModelSpec


def cost_model_from_profile_file(path: Path, model: ModelSpec | str | None = None) -> CostModel:
    """The ``CostModel`` of the profile at ``path``; its source is ``profile-file:<path>``.

    ``model`` (a spec or preset name) must be the model the profile was measured for; None takes
    the profile's own (a preset name, or the cache layout and sizes written in the file). The
    hardware is the preset of that name when there is one (its roofline answers what the file
    does not measure), else a spec of the measured memory and no roofline figures, which the
    file must then not need (it must hold both prefill and decode). Raises ``ProfileFileError``.
    """
    return cost_model_from(load_profile_file(path), model)


def cost_model_from(pf: ProfileFile, model: ModelSpec | str | None = None) -> CostModel:
    """The ``CostModel`` of an already read profile (see ``cost_model_from_profile_file``)."""
    spec = model_spec_for(pf, model)
    warn_missing_plumbing(pf)
    return CostModel(spec, hardware_spec_for(pf), pf.to_profile(pf.label), pf.plumbing)


_log = logging.getLogger("prfaas.perf")
_WARNED: set[str] = set()
"""Profile files already warned about (once per file and process: a simulator's
``--find-max-rate`` builds its cost models many times)."""


def missing_plumbing_message(pf: ProfileFile) -> str | None:
    """The one warning of a profile without some plumbing terms (or with some read from an older
    profile's coarser figure), or None if it has them all."""
    missing, approximated = pf.plumbing.missing, pf.plumbing.approximated
    if not missing and not approximated:
        return None
    parts = [f"not measured, charged as 0: {', '.join(missing)}"] if missing else []
    if approximated:
        parts.append(f"read from an older profile's one figure for both nodes "
                     f"(node_per_request_s): {', '.join(approximated)}")  # fmt: skip
    return (
        f"profile {pf.origin or pf.label}: plumbing terms {'; '.join(parts)} "
        f"(re-run `prfaas profile`; docs/profiles.md)"
    )


def warn_missing_plumbing(pf: ProfileFile) -> None:
    message = missing_plumbing_message(pf)
    if message is not None and pf.origin not in _WARNED:
        _WARNED.add(pf.origin)
        _log.warning(message)


def cost_model_for_hardware(model: ModelSpec | str, hardware: str) -> CostModel:
    """The cost model of ``model`` on ``hardware``: a hardware preset, or a profile file measured
    for that model. Raises ``KeyError`` (unknown preset) or ``ProfileFileError``."""
    if is_profile_file(hardware):
        return cost_model_from_profile_file(Path(hardware), model)
    return cost_model_for(model, hardware)
