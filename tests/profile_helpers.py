"""A profile file for simulator tests: points of a tiny model written where the test says (a
site's ``hardware`` may be a profile file's path), every plumbing term measured as 0 unless
given."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prfaas.perf.plumbing import PlumbingCosts
from prfaas.perf.profile_file import (
    DecodePoint,
    DecodeSection,
    HardwareSection,
    ModelSection,
    PrefillPoint,
    PrefillSection,
    ProfileFile,
)
from prfaas.perf.profile_write import dump_profile_file
from prfaas.spec import get_model


def write_profile(
    path: Path,
    prefill: Sequence[PrefillPoint],
    decode: Sequence[DecodePoint],
    *,
    max_context_tokens: int = 65536,
    memory_bytes: float = 64e9,
    source: str = "torch",
) -> str:
    """``prefill`` and ``decode`` points (decode fitted linearly) of a model named ``tiny`` with
    the paper model's cache; returns the path, as a site's ``hardware``."""
    pf = ProfileFile(
        ModelSection("tiny", get_model("paper-1t").cache, 1e6, 1e6, 64, 4, 16, 4.0,
                     max_context_tokens),
        HardwareSection("cpu-test", memory_bytes),
        PrefillSection("piecewise-linear", tuple(prefill)),
        DecodeSection("linear", points=tuple(decode)), (("source", source),), "test",
        plumbing=PlumbingCosts(missing=()),
    )  # fmt: skip
    dump_profile_file(pf, path)
    return str(path)
