"""Layering: policy, cache, sim and workload import neither torch nor asyncio (fresh interpreter),
and policy/cache/workload never import the simulator."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
def test_simulation_layers_are_pure() -> None:
    code = """
import sys
import prfaas.policy, prfaas.cache, prfaas.workload
leaked_sim = [m for m in sys.modules if m.startswith("prfaas.sim")]
import prfaas.sim
from prfaas.sim import Simulator, paper_deployment
sim = Simulator(paper_deployment("paper-prfaas"))
sim.run(until_s=30.0)
bad = [m for m in ("torch", "asyncio", "transformers", "pydantic") if m in sys.modules]
print(",".join(bad) + "|" + ",".join(leaked_sim))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    bad, leaked = proc.stdout.strip().split("|")
    assert bad == "", f"imported: {bad}"
    assert leaked == "", f"policy/cache/workload imported the simulator: {leaked}"
