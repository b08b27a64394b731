"""``ChildGroup``: a dead leader's helpers are killed before it is reaped, a child that ignores
SIGTERM is SIGKILLed after the grace, and nothing is left a zombie."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prfaas.serve.process_group import ChildGroup, LeaderState, terminate

pytestmark = pytest.mark.timeout(60)

# The leader starts a helper in its own group, prints the helper's pid, then exits or waits.
LEADER = """
import subprocess, sys, time, signal
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(helper.pid, flush=True)
if sys.argv[1] == "exit":
    sys.exit(3)
time.sleep(120)
"""


def _spawn(mode: str) -> tuple[ChildGroup, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LEADER, mode], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None
    helper = int(proc.stdout.readline())
    proc.stdout.close()
    return ChildGroup(proc), helper


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if stat[0] == "Z" and int(stat[1]) != os.getpid():
            return  # dead; its new parent reaps it
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still alive")


def test_a_dead_leaders_helpers_are_killed_then_it_is_reaped() -> None:
    group, helper = _spawn("exit")
    deadline = time.monotonic() + 20
    while group.state() is LeaderState.ALIVE and time.monotonic() < deadline:
        time.sleep(0.02)
    assert group.state() is LeaderState.DEAD  # seen, not reaped: the group id is still held
    assert group.poll() == 3
    assert group.state() is LeaderState.REAPED
    _wait_gone(helper)
    assert not Path(f"/proc/{group.pid}").exists()  # reaped: no zombie left


def test_terminate_kills_a_group_that_ignores_sigterm() -> None:
    polite, polite_helper = _spawn("wait")
    stubborn, stubborn_helper = _spawn("stubborn")
    terminate([polite, stubborn], grace_s=0.5)
    assert polite.proc.returncode == -signal.SIGTERM
    assert stubborn.proc.returncode == -signal.SIGKILL
    for pid in (polite_helper, stubborn_helper):
        _wait_gone(pid)
    terminate([polite, stubborn], grace_s=0.5)  # again: reaped leaders are never signalled


# The parent starts a child that dies with it, stops it (as profile_sharing does between its
# rounds), prints its pid, and waits to be killed.
PARENT = """
import os, signal, subprocess, sys, time
from prfaas.serve.process_group import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         preexec_fn=die_with_parent)
os.kill(child.pid, signal.SIGSTOP)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_stopped_child_dies_with_its_sigkilled_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":  # killed; its new parent (init) reaps it
                break
            time.sleep(0.05)
        gone = not Path(f"/proc/{child}").exists() or state == "Z"
        assert gone, f"child {child} outlived its parent"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
