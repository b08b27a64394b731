"""``reload.json`` in a running pool's workdir: the outcome of its last tenant reload, which the
pool's launcher writes (``prfaas up pool.yaml`` on SIGHUP) and ``prfaas reload`` waits for. A
sequence number tells a reader's reload from an earlier one."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from prfaas.pool.resolved import write_private

RELOAD_NAME = "reload.json"


@dataclass(frozen=True, slots=True)
class ReloadResult:
    seq: int
    applied: bool
    message: str
    bad_file: bool = False
    """Not applied because the pool file does not load (the message names the field)."""


def read_reload_result(workdir: Path) -> ReloadResult | None:
    try:
        doc = json.loads((workdir / RELOAD_NAME).read_text())
        return ReloadResult(int(doc["seq"]), bool(doc["applied"]), str(doc["message"]),
                            bool(doc.get("bad_file", False)))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_reload_result(workdir: Path, applied: bool, message: str, bad_file: bool) -> None:
    last = read_reload_result(workdir)
    doc = {"seq": (last.seq if last else 0) + 1, "applied": applied, "message": message,
           "bad_file": bad_file, "at_unix_s": round(time.time(), 3)}  # fmt: skip
    write_private(workdir / RELOAD_NAME, json.dumps(doc))
