"""``ChildGroup``: a child process that leads its own process group, signalled and reaped without
ever hitting a recycled process id.

A group's id is its leader's pid. While the leader is alive, or dead but not yet reaped (a
zombie), that id cannot be given to another process, so signalling the group is safe; once the
leader is reaped it can be. Hence the order everywhere here: look at the leader without reaping it
(``waitid(..., WNOWAIT)``), kill whatever is left in its group (helpers it spawned), then reap.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import os
import signal
import subprocess
import sys
import time


class LeaderState(enum.Enum):
    ALIVE = "alive"
    DEAD = "dead"
    """Exited, not yet reaped: the group id is still held."""
    REAPED = "reaped"
    """Gone: the group id may belong to someone else now; never signal it."""


class ChildGroup:
    """What the supervisor polls (it fits ``serve.supervisor.Process``)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def state(self) -> LeaderState:
        if self.proc.returncode is not None:
            return LeaderState.REAPED
        try:
            seen = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped behind our back
            return LeaderState.REAPED
        return LeaderState.ALIVE if seen is None else LeaderState.DEAD

    def signal_group(self, sig: int) -> None:
        """Signal every process of the group, unless the leader is reaped already."""
        if self.state() is not LeaderState.REAPED:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def poll(self) -> int | None:
        """None while the leader lives; once it has died, its group is killed and it is reaped
        (so a dead child is never left a zombie, nor its helpers left running)."""
        if self.state() is LeaderState.DEAD:
            self.signal_group(signal.SIGKILL)
        return self.proc.poll()


def terminate(groups: list[ChildGroup], grace_s: float) -> None:
    """SIGTERM each live group, give the leaders up to ``grace_s`` to exit, then SIGKILL each
    group (its leader unreaped, so the id is still its own) and reap."""
    live = [g for g in groups if g.state() is not LeaderState.REAPED]
    for g in live:
        if g.state() is LeaderState.ALIVE:
            g.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(g.state() is LeaderState.ALIVE for g in live):
        time.sleep(0.02)
    for g in live:
        g.signal_group(signal.SIGKILL)  # the group: helpers included
        g.proc.wait()


def pid_alive(pid: object) -> bool:
    """Whether ``pid`` (anything read from a state file) names a live process, ours or not."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when the thread that started it dies (a
    ``preexec_fn``, or the first call of a child): a parent that is SIGKILLed, or SIGTERMed
    without handlers, cannot stop its children itself, and a child it had SIGSTOPped would wait
    for ever (SIGKILL ends a stopped process too). Linux only; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(PR_SET_PDEATHSIG, int(sig))
