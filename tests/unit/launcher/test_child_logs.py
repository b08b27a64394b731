"""Children's logs: size-capped, rotated at line ends, a bounded number kept, tails across a
rotation; the pump copies a pipe to its end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prfaas.serve.childlog import LogPump, RotatingLog

pytestmark = pytest.mark.timeout(30)


def test_rotates_at_the_cap_on_line_ends_and_keeps_k_files(tmp_path: Path) -> None:
    log = RotatingLog(tmp_path / "pd.log", max_bytes=100, backups=2)
    lines = [f"line {i:03d} ".encode() + b"x" * 20 + b"\n" for i in range(40)]  # 30 bytes each
    for line in lines:
        log.write(line)
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["pd.log", "pd.log.1", "pd.log.2"]
    kept = b"".join((tmp_path / n).read_bytes() for n in ("pd.log.2", "pd.log.1", "pd.log"))
    assert all(len((tmp_path / n).read_bytes()) <= 100 for n in files)
    # whole lines only, and the newest ones, in order
    assert kept.endswith(b"".join(lines[-3:]))
    # each file holds whole lines (30 bytes each): a rotation never splits one
    assert all(len((tmp_path / n).read_bytes()) % 30 == 0 for n in files)
    assert kept == b"".join(lines[len(lines) - kept.count(b"\n") :])


def test_one_big_write_is_split_and_a_line_longer_than_the_cap_is_cut(tmp_path: Path) -> None:
    log = RotatingLog(tmp_path / "g.log", max_bytes=50, backups=5)
    log.write(b"a" * 120)  # no line end at all
    log.write(b"tail\n")
    log.close()
    sizes = [len(p.read_bytes()) for p in log.files()]
    assert max(sizes) <= 50 and sum(sizes) == 125


def test_tail_reads_across_a_rotation_and_reopen_appends(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    log = RotatingLog(path, max_bytes=40, backups=1)
    for i in range(6):
        log.write(f"message {i}\n".encode())  # 10 bytes each: rotates after 4
    assert log.tail(3) == "message 3\nmessage 4\nmessage 5"
    log.close()
    again = RotatingLog(path, max_bytes=40, backups=1)  # a second launcher run appends
    again.write(b"after\n")
    assert again.tail(1) == "after" and path.read_bytes().startswith(b"message 4")
    again.close()


def test_no_backups_keeps_only_the_current_file(tmp_path: Path) -> None:
    log = RotatingLog(tmp_path / "x.log", max_bytes=10, backups=0)
    for _ in range(5):
        log.write(b"0123456\n")
    log.close()
    assert [p.name for p in tmp_path.iterdir()] == ["x.log"]
    with pytest.raises(ValueError):
        RotatingLog(tmp_path / "y.log", max_bytes=0)


def test_pump_copies_a_pipe_to_its_end(tmp_path: Path) -> None:
    log = RotatingLog(tmp_path / "p.log", max_bytes=1 << 20)
    read_fd, write_fd = os.pipe()
    pump = LogPump(read_fd, log, "p")
    payload = b"".join(f"{i}\n".encode() for i in range(20_000))
    with os.fdopen(write_fd, "wb") as w:
        w.write(payload)
    assert pump.join(10.0)
    log.close()
    assert (tmp_path / "p.log").read_bytes() == payload
