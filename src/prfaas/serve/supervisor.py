"""``Supervisor``: the bookkeeping that keeps a desired set of processes running.

It owns *which* processes should run and *when* a dead one is started again: exponential backoff
(``initial_backoff_s`` doubling to ``max_backoff_s``, back to the start after a stable run), and a
give-up rule (``max_deaths`` deaths within ``death_window_s``: the member is reported and left
down). Only members of the set are restarted: ``remove(name)`` takes a member out of the set
*before* its process is stopped, so a deliberate stop is never mistaken for a death.

It does no I/O of its own: processes come from an injected ``spawn(name)`` and are observed with
``poll()`` (which, for a ``subprocess.Popen``, also reaps the child: no zombies); ``now`` is passed
to every call. The launcher drives it from a thread; the unit tests drive it with fake processes
and a hand-set clock.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class Process(Protocol):
    """What the supervisor needs of a child: ``subprocess.Popen`` fits."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    initial_backoff_s: float = 0.5
    """Wait before the first restart after a death."""
    max_backoff_s: float = 10.0
    """The wait doubles per quick death up to this."""
    max_deaths: int = 5
    """This many deaths within ``death_window_s`` and the member is left down (``FAILED``)."""
    death_window_s: float = 60.0
    """Window of the give-up rule."""
    stable_after_s: float = 30.0
    """A run at least this long resets the backoff to ``initial_backoff_s``."""

    def __post_init__(self) -> None:
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                f"need 0 < initial_backoff_s <= max_backoff_s, got "
                f"{self.initial_backoff_s:g} and {self.max_backoff_s:g}"
            )
        if self.max_deaths < 1:
            raise ValueError(f"max_deaths must be >= 1, got {self.max_deaths}")
        if self.death_window_s <= 0 or self.stable_after_s <= 0:
            raise ValueError("death_window_s and stable_after_s must be > 0")

    def backoff_s(self, num_quick_deaths: int) -> float:
        """Wait before restarting after the ``num_quick_deaths``-th death in a row (from 1)."""
        return min(self.max_backoff_s, self.initial_backoff_s * 2.0 ** (num_quick_deaths - 1))


class MemberState(enum.Enum):
    RUNNING = "running"
    BACKOFF = "backoff"
    """Dead, to be started again at ``restart_at_s``."""
    FAILED = "failed"
    """Died too often (or could not be spawned too often): reported and left down."""
    EXITED = "exited"
    """Dead, and the supervisor was told not to restart (``policy=None``)."""


class EventKind(enum.Enum):
    STARTED = "started"
    DIED = "died"
    GAVE_UP = "gave_up"
    REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class Event:
    at_s: float
    member: str
    kind: EventKind
    detail: str
    """Human-readable: exit status, the wait before the restart, why it gave up."""


@dataclass(frozen=True, slots=True)
class MemberStatus:
    name: str
    state: MemberState
    pid: int | None
    num_starts: int
    """Starts so far, the first included (restarts = num_starts - 1)."""
    last_exit: str | None
    """How the last run ended (``exit status 1``, ``killed by SIGKILL``), if it did."""
    restart_at_s: float | None


@dataclass
class _Member:
    name: str
    proc: Process | None = None
    state: MemberState = MemberState.RUNNING
    started_at_s: float = 0.0
    num_starts: int = 0
    num_quick_deaths: int = 0
    deaths_s: deque[float] = field(default_factory=deque)
    restart_at_s: float | None = None
    last_exit: str | None = None


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "could not be started"
    if returncode < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


class Supervisor:
    """The desired set and its restart bookkeeping. Not thread-safe: the caller serialises."""

    def __init__(
        self, spawn: Callable[[str], Process], policy: RestartPolicy | None = RestartPolicy()
    ) -> None:
        self._spawn = spawn
        self.policy = policy
        self._members: dict[str, _Member] = {}

    # -- the set ---------------------------------------------------------------------------------
    def add(self, name: str, now_s: float) -> list[Event]:
        """Put ``name`` in the set and start it now."""
        if name in self._members:
            raise ValueError(f"{name} is already supervised")
        member = _Member(name)
        self._members[name] = member
        return self._start(member, now_s)

    def remove(self, name: str, now_s: float) -> tuple[Process | None, list[Event]]:
        """Take ``name`` out of the set first (it will not be restarted); returns its process, if
        one is running, for the caller to stop and reap."""
        member = self._members.pop(name)
        proc = member.proc if member.state is MemberState.RUNNING else None
        return proc, [Event(now_s, name, EventKind.REMOVED, "taken out of the set")]

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def names(self) -> list[str]:
        return list(self._members)

    def process(self, name: str) -> Process | None:
        member = self._members[name]
        return member.proc if member.state is MemberState.RUNNING else None

    def status(self) -> tuple[MemberStatus, ...]:
        return tuple(
            MemberStatus(
                m.name,
                m.state,
                m.proc.pid if m.proc is not None and m.state is MemberState.RUNNING else None,
                m.num_starts,
                m.last_exit,
                m.restart_at_s,
            )
            for m in self._members.values()
        )

    # -- one step --------------------------------------------------------------------------------
    def tick(self, now_s: float) -> list[Event]:
        """Notice (and reap) deaths, then start every member whose backoff has run out."""
        events: list[Event] = []
        for member in list(self._members.values()):
            if member.state is MemberState.RUNNING and member.proc is not None:
                code = member.proc.poll()
                if code is not None:
                    events += self._died(member, describe_exit(code), now_s)
            if (
                member.state is MemberState.BACKOFF
                and member.restart_at_s is not None
                and now_s >= member.restart_at_s
            ):
                events += self._start(member, now_s)
        return events

    def _start(self, member: _Member, now_s: float) -> list[Event]:
        member.num_starts += 1
        member.restart_at_s = None
        try:
            member.proc = self._spawn(member.name)
        except OSError as exc:  # e.g. the interpreter vanished, out of pids: a death like any
            member.proc = None
            member.state = MemberState.RUNNING
            return self._died(member, f"could not be started: {exc}", now_s)
        member.state = MemberState.RUNNING
        member.started_at_s = now_s
        what = "started" if member.num_starts == 1 else f"restarted (start {member.num_starts})"
        return [Event(now_s, member.name, EventKind.STARTED, f"{what}, pid {member.proc.pid}")]

    def _died(self, member: _Member, how: str, now_s: float) -> list[Event]:
        member.last_exit = how
        policy = self.policy
        if policy is None:
            member.state = MemberState.EXITED
            return [Event(now_s, member.name, EventKind.DIED, f"{how}; not restarted")]
        member.deaths_s.append(now_s)
        while member.deaths_s and member.deaths_s[0] <= now_s - policy.death_window_s:
            member.deaths_s.popleft()
        if len(member.deaths_s) >= policy.max_deaths:
            member.state = MemberState.FAILED
            return [
                Event(now_s, member.name, EventKind.DIED, how),
                Event(
                    now_s,
                    member.name,
                    EventKind.GAVE_UP,
                    f"{len(member.deaths_s)} deaths within {policy.death_window_s:g} s "
                    f"(last: {how}); left down",
                ),
            ]
        stable = member.proc is not None and now_s - member.started_at_s >= policy.stable_after_s
        member.num_quick_deaths = 1 if stable else member.num_quick_deaths + 1
        wait_s = policy.backoff_s(member.num_quick_deaths)
        member.state = MemberState.BACKOFF
        member.restart_at_s = now_s + wait_s
        return [Event(now_s, member.name, EventKind.DIED, f"{how}; restarting in {wait_s:g} s")]
