"""The pure layers import neither torch nor asyncio (nor transformers), in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE = ("core", "spec", "perf", "analytic", "policy", "cache", "sim", "workload")


@pytest.mark.timeout(120)
def test_pure_layers_import_no_torch_no_asyncio() -> None:
    code = f"""
import importlib, importlib.util, sys
for name in {PURE!r}:
    if importlib.util.find_spec("prfaas." + name) is not None:
        importlib.import_module("prfaas." + name)
bad = [m for m in ("torch", "asyncio", "transformers", "pydantic") if m in sys.modules]
print(",".join(bad))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"pure layers imported: {proc.stdout.strip()}"
