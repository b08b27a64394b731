"""Per-process logs of the launcher's children, size-capped and rotated by the launcher.

A child writes its stdout and stderr into a pipe; a ``LogPump`` thread reads it and appends to a
``RotatingLog`` (``NAME.log``, rotated to ``NAME.log.1`` .. ``NAME.log.K`` at ``max_bytes``). The
launcher, not the child, rotates because a child holding a plain file handle keeps writing to the
renamed file: only the reader of a pipe can cut a file it does not own. One ``RotatingLog`` per
supervised member outlives its restarts (the launcher writes a marker line per start), so a crash
loop stays in one place and within its cap.

Cost (``bench/launcher_logs.py``, 200 MB of 100-byte lines): the child, not the pump, sets the pace
(88-180 MB/s through the pipe vs 61-138 MB/s into a file on this 2-core machine), for 3.4-4.0
launcher CPU seconds per GB, with 32 MB left on disk instead of 200. A worker logs warnings
(kilobytes an hour), so the pipe never holds a child back.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import BinaryIO

DEFAULT_MAX_BYTES = 10 << 20
DEFAULT_BACKUPS = 3
READ_BYTES = 64 << 10


class RotatingLog:
    """An append-only byte log capped at ``max_bytes`` per file, ``backups`` old files kept.

    Thread-safe: a restarted child's pump may start while the old one drains its last bytes."""

    def __init__(
        self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS
    ) -> None:
        if max_bytes < 1 or backups < 0:
            raise ValueError(f"need max_bytes >= 1 and backups >= 0, got {max_bytes}, {backups}")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._file: BinaryIO = path.open("ab")
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        with self._lock:
            while data:
                room = max(0, self.max_bytes - self._size)
                if len(data) <= room:
                    self._append(data)
                    return
                # Cut at a line end where one fits, so a rotated file ends on a whole line.
                cut = data.rfind(b"\n", 0, room) + 1
                if cut == 0:
                    cut = room if self._size == 0 else 0
                if cut:
                    self._append(data[:cut])
                    data = data[cut:]
                self._rotate()

    def _append(self, data: bytes) -> None:
        self._file.write(data)
        self._file.flush()  # a crash's last words must be on disk for the log tail
        self._size += len(data)

    def _rotate(self) -> None:
        self._file.close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for i in range(self.backups - 1, 0, -1):
                older = self._numbered(i)
                if older.exists():
                    older.replace(self._numbered(i + 1))
            self.path.replace(self._numbered(1))
        self._file = self.path.open("ab")
        self._size = 0

    def _numbered(self, i: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{i}")

    def files(self) -> list[Path]:
        """Oldest first, the current file last."""
        old = [self._numbered(i) for i in range(self.backups, 0, -1)]
        return [p for p in old if p.exists()] + [self.path]

    def tail(self, num_lines: int = 15) -> str:
        """The last lines written, across a rotation if the current file is short."""
        with self._lock:
            lines: list[str] = []
            for path in reversed(self.files()):
                try:
                    text = path.read_bytes().decode(errors="replace")
                except OSError:
                    continue
                lines = text.splitlines() + lines
                if len(lines) >= num_lines:
                    break
            return "\n".join(lines[-num_lines:])

    def close(self) -> None:
        with self._lock:
            self._file.close()


class LogPump:
    """A daemon thread copying one pipe into a ``RotatingLog`` until end of file.

    The pipe ends when every process holding its write end has gone (the child and any helper it
    spawned: the launcher kills the whole process group)."""

    def __init__(self, read_fd: int, log: RotatingLog, name: str) -> None:
        self._fd = read_fd
        self._log = log
        self._thread = threading.Thread(target=self._run, name=f"log-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                try:
                    data = os.read(self._fd, READ_BYTES)
                except OSError:
                    return
                if not data:
                    return
                with contextlib.suppress(
                    OSError, ValueError
                ):  # disk full, log closed: keep reading
                    self._log.write(data)
        finally:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    def join(self, timeout_s: float) -> bool:
        """True when the pipe was drained to its end within ``timeout_s``."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
