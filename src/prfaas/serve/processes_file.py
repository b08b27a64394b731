"""``processes.json``: the launcher's state file, beside the resolved deployment file.

The launcher rewrites it on every supervisor event and once more, marked stopped, when it stops;
``prfaas status`` reads it (``commands/status.py``). It holds the launcher's pid, each member's
state, pid, restarts, last exit and log path, and the last 20 events. Written through a
temporary file so a reader never sees half of one; a failed write is skipped (the next event
writes it again).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from prfaas.serve.childlog import RotatingLog
from prfaas.serve.supervisor import Event, MemberStatus

PROCESSES_NAME = "processes.json"
NUM_EVENTS = 20


def write_processes_file(
    workdir: Path,
    members: Sequence[MemberStatus],
    logs: Mapping[str, RotatingLog],
    events: Iterable[tuple[float, Event]],
    stopped: bool = False,
) -> None:
    """Write ``workdir/processes.json``: ``members`` as they are, ``events`` (wall time, event;
    oldest first) the newest ``NUM_EVENTS`` of them; ``stopped`` marks every member stopped."""
    doc = {
        "launcher_pid": os.getpid(),
        "stopped": stopped,
        "processes": [
            {
                "name": m.name,
                "state": "stopped" if stopped else m.state.value,
                "pid": None if stopped else m.pid,
                "restarts": max(0, m.num_starts - 1),
                "last_exit": m.last_exit,
                "log": str(logs[m.name].path) if m.name in logs else None,
            }
            for m in members
        ],
        "events": [
            {
                "at_unix_s": round(at, 3),
                "member": e.member,
                "kind": e.kind.value,
                "detail": e.detail,
            }
            for at, e in list(events)[-NUM_EVENTS:]
        ],
    }
    tmp = workdir / f".{PROCESSES_NAME}.tmp"
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(workdir / PROCESSES_NAME)
