"""``DecisionLog``: the gateway's JSON-lines file of policy calls (``gateway.decision_log``), and
``read_decision_log`` for a replay. The records are ``policy.decision_log``'s; this module only
writes and reads lines. Each record is written and flushed when the call returns (the gateway's
policy calls run on one event loop, so the file's order is the call order); a line is a few KB
(one cluster snapshot), meant for test and debugging runs, not for production traffic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from prfaas.policy.decision_log import Record


class DecisionLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = self.path.open("a", encoding="utf-8")
        self.num_records = 0

    def write(self, record: Record) -> None:
        if self._file is None:
            return  # closed at shutdown: calls still in flight are not logged
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()
        self.num_records += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_decision_log(path: str | Path) -> list[Record]:
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
