"""``Trace``: the connector's timestamped events, for finding where a transfer's time goes.

``PRFAAS_VLLM_TRACE`` in a vLLM server's environment names a file; the connector's scheduler
side (EngineCore), its worker side and the transfer thread (Worker) append one JSON object a line
there. No file: every call returns at once. Imports neither torch nor vllm.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time

log = logging.getLogger("prfaas.integrations.vllm")
TRACE_ENV = "PRFAAS_VLLM_TRACE"
"""A file path in a vLLM server's environment: the connector appends timestamped events there."""


class Trace:
    """Timestamped events of the connector, one JSON object a line, appended to the file that
    ``PRFAAS_VLLM_TRACE`` names (no file: every call returns at once). ``t`` is
    ``time.monotonic()``, one clock for every process of the host, so a client's timestamps line
    up with the Worker's and EngineCore's. Each line is one ``write`` on an ``O_APPEND`` file, so
    processes sharing the file never interleave within a line."""

    def __init__(self, path: str | None = None) -> None:
        path = os.environ.get(TRACE_ENV) if path is None else path
        self._fd = -1
        if path:
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            except OSError as exc:
                log.warning("%s=%s: not tracing: %s", TRACE_ENV, path, exc)

    @property
    def on(self) -> bool:
        return self._fd >= 0

    def __call__(self, event: str, tid: str = "", **fields: object) -> None:
        if self._fd < 0:
            return
        rec = {
            "t": time.monotonic(),
            "pid": os.getpid(),
            "thread": threading.current_thread().name,
            "ev": event,
            "tid": tid,
            **fields,
        }
        with contextlib.suppress(OSError):
            os.write(self._fd, json.dumps(rec).encode() + b"\n")


TRACE = Trace()
"""The process's trace (the connector's scheduler side in EngineCore, its worker side and this
thread in the Worker)."""
