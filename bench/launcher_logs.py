"""What the launcher's log path costs: a child writing lines to its stdout, either straight into a
file (what the launcher did before: no cap) or through a pipe into the launcher's ``LogPump`` and
``RotatingLog`` (10 MB x 3 by default: capped). Side by side, in one run:

    .venv/bin/python bench/launcher_logs.py            # 200 MB of 100-byte lines
    .venv/bin/python bench/launcher_logs.py --mb 50 --line-bytes 200

Figures: the child's wall time to write everything (a pipe the launcher drained too slowly would
show here: the child blocks on a full pipe), the launcher's CPU seconds per GB for the pump, and
the bytes left on disk. A worker logs warnings (kilobytes an hour), so what matters is that the
pump is far faster than any child logs and that the disk use stays under the cap.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from prfaas.serve.childlog import LogPump, RotatingLog  # noqa: E402

WRITER = """
import sys
line = b"x" * ({line_bytes} - 1) + b"\\n"
out = sys.stdout.buffer
for _ in range({num_lines}):
    out.write(line)
out.flush()
"""


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def direct(workdir: Path, code: str) -> tuple[float, float, int]:
    path = workdir / "direct.log"
    cpu0, t0 = _cpu_s(), time.perf_counter()
    with path.open("wb") as f:
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True)
    return time.perf_counter() - t0, _cpu_s() - cpu0, path.stat().st_size


def piped(workdir: Path, code: str, max_bytes: int, backups: int) -> tuple[float, float, int]:
    log = RotatingLog(workdir / "piped.log", max_bytes, backups)
    read_fd, write_fd = os.pipe()
    cpu0, t0 = _cpu_s(), time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=write_fd)
    os.close(write_fd)
    pump = LogPump(read_fd, log, "bench")
    proc.wait()
    child_s = time.perf_counter() - t0
    assert pump.join(60.0)
    cpu_s = _cpu_s() - cpu0
    log.close()
    return child_s, cpu_s, sum(p.stat().st_size for p in log.files())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=200.0, help="megabytes the child writes")
    ap.add_argument("--line-bytes", type=int, default=100)
    ap.add_argument("--max-bytes", type=int, default=10 << 20)
    ap.add_argument("--backups", type=int, default=3)
    args = ap.parse_args()
    num_lines = int(args.mb * 1e6 / args.line_bytes)
    code = WRITER.format(line_bytes=args.line_bytes, num_lines=num_lines)
    total = num_lines * args.line_bytes
    with tempfile.TemporaryDirectory() as tmp:
        rows = [("file handle (uncapped)", *direct(Path(tmp), code))]
        rows.append(
            ("pipe + pump + rotation", *piped(Path(tmp), code, args.max_bytes, args.backups))
        )
    print(f"child writes {total / 1e6:.0f} MB in {args.line_bytes}-byte lines")
    print(f"{'path':<24} {'child MB/s':>10} {'launcher CPU s/GB':>18} {'on disk MB':>11}")
    for name, wall_s, cpu_s, on_disk in rows:
        print(
            f"{name:<24} {total / 1e6 / wall_s:>10.0f} {cpu_s / (total / 1e9):>18.2f} "
            f"{on_disk / 1e6:>11.1f}"
        )


if __name__ == "__main__":
    main()
