"""Fault injection for the connector's containment tests: ``PRFAAS_VLLM_FAULT_INJECTION=1`` in a
vLLM server's environment makes a transfer id ``fault-<where>-...`` raise at ``<where>``.

Both sides of the connector call ``inject`` at their named points (``FAULT_POINTS``); without the
variable the ids mean nothing. Imports neither torch nor vllm.
"""

from __future__ import annotations

import os

FAULT_ENV = "PRFAAS_VLLM_FAULT_INJECTION"
"""Set to 1 in a vLLM server's environment to raise at ``<where>`` for transfer ids
``fault-<where>-...``, where is one of ``FAULT_POINTS`` (tests of the fault containment)."""
FAULT_POINTS = ("match", "alloc", "meta", "finished", "claim", "open", "save", "finish", "install")
"""Scheduler side (EngineCore): match, alloc, meta, finished; worker side: the rest."""


class InjectedFault(RuntimeError):
    """Raised where ``FAULT_ENV`` asks for it."""


def inject(where: str, tid: str) -> None:
    if tid.startswith(f"fault-{where}-") and os.environ.get(FAULT_ENV) == "1":
        raise InjectedFault(f"fault injected at {where} for transfer {tid} ({FAULT_ENV}=1)")
