"""Files the commands write for an operator, shared by ``prfaas sim`` and ``prfaas bench``: the
per-request CSV (columns: ``workload.request_columns``) and the Perfetto / Chrome trace JSON
(built by ``sim.perfetto``). Each is written to a temporary file beside its path and renamed:
never a half-written file. Bad paths are a ``UsageError`` (exit 2) before any work is done.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from prfaas.errors import UsageError

if TYPE_CHECKING:
    from prfaas.workload.request_columns import RequestRow


def check_output(flag: str, path: Path | None) -> None:
    """``path`` can be written: its folder exists and it is not a folder."""
    if path is None:
        return
    if not path.parent.is_dir():
        raise UsageError(f"{flag}: folder {path.parent} does not exist")
    if path.is_dir():
        raise UsageError(f"{flag}: {path} is a folder")


def _atomic(path: Path, write: Callable[[IO[str]], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            write(f)
        # mkstemp makes it private (0600); the file is a report: the usual mode under the umask.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_requests_csv(path: Path, rows: Iterable[RequestRow]) -> None:
    import csv

    from prfaas.workload.request_columns import COLUMNS, cells

    def write(f: IO[str]) -> None:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(cells(r) for r in rows)

    _atomic(path, write)


def write_trace(path: Path, trace: dict[str, Any]) -> None:
    import json

    # Compact: a trace of a long run holds a few spans per request.
    _atomic(path, lambda f: json.dump(trace, f, separators=(",", ":")))
