"""The supervisor's restart, backoff and give-up bookkeeping, on fake processes and a hand-set
clock: no sleeps, no real children."""

from __future__ import annotations

import signal

import pytest

from prfaas.serve.supervisor import (
    EventKind,
    MemberState,
    RestartPolicy,
    Supervisor,
    describe_exit,
)

pytestmark = pytest.mark.timeout(30)


class FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.num_polls = 0

    def poll(self) -> int | None:
        self.num_polls += 1
        return self.returncode


class Spawner:
    def __init__(self) -> None:
        self.started: list[tuple[str, FakeProcess]] = []
        self.fail_next = 0

    def __call__(self, name: str) -> FakeProcess:
        if self.fail_next:
            self.fail_next -= 1
            raise OSError("no more pids")
        proc = FakeProcess(1000 + len(self.started))
        self.started.append((name, proc))
        return proc

    def current(self, name: str) -> FakeProcess:
        return [p for n, p in self.started if n == name][-1]

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.started if n == name)


POLICY = RestartPolicy(
    initial_backoff_s=0.5, max_backoff_s=10.0, max_deaths=5, death_window_s=60, stable_after_s=30
)


def _state(sup: Supervisor, name: str) -> MemberState:
    return next(m.state for m in sup.status() if m.name == name)


def test_only_the_dead_member_is_restarted_after_its_backoff() -> None:
    spawn = Spawner()
    sup = Supervisor(spawn, POLICY)
    sup.add("gateway", 0.0)
    sup.add("pd", 0.0)
    spawn.current("pd").returncode = -signal.SIGKILL
    events = sup.tick(1.0)
    assert [(e.member, e.kind) for e in events] == [("pd", EventKind.DIED)]
    assert "killed by SIGKILL; restarting in 0.5 s" in events[0].detail
    assert _state(sup, "pd") is MemberState.BACKOFF
    assert sup.tick(1.4) == []  # the backoff has not run out
    events = sup.tick(1.5)
    assert [(e.member, e.kind) for e in events] == [("pd", EventKind.STARTED)]
    assert spawn.count("pd") == 2 and spawn.count("gateway") == 1
    assert _state(sup, "pd") is MemberState.RUNNING
    status = {m.name: m for m in sup.status()}
    assert status["pd"].num_starts == 2 and status["pd"].last_exit == "killed by SIGKILL"
    assert status["pd"].pid == spawn.current("pd").pid


def test_backoff_doubles_to_its_cap_and_resets_after_a_stable_run() -> None:
    spawn = Spawner()
    policy = RestartPolicy(max_deaths=100, death_window_s=1.0, stable_after_s=30)
    sup = Supervisor(spawn, policy)
    sup.add("w", 0.0)
    now, waits = 0.0, []
    for _ in range(7):
        spawn.current("w").returncode = 1
        (died,) = sup.tick(now)
        assert died.kind is EventKind.DIED
        restart_at = next(m.restart_at_s for m in sup.status())
        assert restart_at is not None
        waits.append(restart_at - now)
        now = restart_at
        (started,) = sup.tick(now)
        assert started.kind is EventKind.STARTED
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    now += 30.0  # a run that long counts as stable: the next death waits the initial backoff
    spawn.current("w").returncode = 1
    sup.tick(now)
    assert next(m.restart_at_s for m in sup.status()) == now + 0.5


def test_a_member_that_keeps_dying_is_reported_and_left_down() -> None:
    spawn = Spawner()
    sup = Supervisor(spawn, POLICY)
    sup.add("pf0", 0.0)
    now = 0.0
    events = []
    for _ in range(5):
        spawn.current("pf0").returncode = 3
        events = sup.tick(now)
        if _state(sup, "pf0") is MemberState.FAILED:
            break
        now = next(m.restart_at_s for m in sup.status()) or now
        sup.tick(now)
    assert [e.kind for e in events] == [EventKind.DIED, EventKind.GAVE_UP]
    assert "5 deaths within 60 s (last: exit status 3); left down" in events[1].detail
    assert _state(sup, "pf0") is MemberState.FAILED
    assert spawn.count("pf0") == 5
    assert sup.tick(now + 1000.0) == []  # never started again
    assert spawn.count("pf0") == 5
    assert next(m.pid for m in sup.status()) is None


def test_deaths_outside_the_window_do_not_count_toward_giving_up() -> None:
    spawn = Spawner()
    sup = Supervisor(spawn, RestartPolicy(max_deaths=3, death_window_s=60, stable_after_s=1000))
    sup.add("w", 0.0)
    for now in (0.0, 40.0, 80.0, 120.0, 160.0):  # never 3 deaths within 60 s
        spawn.current("w").returncode = 1
        sup.tick(now)
        assert _state(sup, "w") is MemberState.BACKOFF
        sup.tick(now + 20.0)  # the longest backoff here is 2 s
        assert _state(sup, "w") is MemberState.RUNNING
    spawn.current("w").returncode = 1
    sup.tick(170.0)  # deaths at 120, 160, 170
    assert _state(sup, "w") is MemberState.FAILED


def test_removed_member_is_out_of_the_set_before_it_is_stopped() -> None:
    spawn = Spawner()
    sup = Supervisor(spawn, POLICY)
    sup.add("gateway", 0.0)
    sup.add("pd", 0.0)
    proc, events = sup.remove("pd", 1.0)
    assert proc is spawn.current("pd")
    assert [e.kind for e in events] == [EventKind.REMOVED]
    proc.returncode = -signal.SIGTERM  # the caller stops it: no death is reported, no restart
    assert sup.tick(2.0) == [] and sup.tick(100.0) == []
    assert spawn.count("pd") == 1 and "pd" not in sup and sup.names() == ["gateway"]
    # a member waiting in backoff is removed too: nothing to stop, never restarted
    spawn.current("gateway").returncode = 1
    sup.tick(3.0)
    proc, _ = sup.remove("gateway", 3.1)
    assert proc is None and sup.tick(100.0) == [] and spawn.count("gateway") == 1


def test_every_running_member_is_polled_each_tick() -> None:
    # poll() is what reaps a real child: a member never polled would be a zombie
    spawn = Spawner()
    sup = Supervisor(spawn, POLICY)
    for name in ("gateway", "a", "b"):
        sup.add(name, 0.0)
    sup.tick(0.1)
    sup.tick(0.2)
    assert [p.num_polls for _, p in spawn.started] == [2, 2, 2]


def test_without_a_policy_deaths_are_reaped_and_reported_not_restarted() -> None:
    spawn = Spawner()
    sup = Supervisor(spawn, policy=None)
    sup.add("pd", 0.0)
    spawn.current("pd").returncode = -signal.SIGKILL
    (event,) = sup.tick(1.0)
    assert event.kind is EventKind.DIED and event.detail.endswith("not restarted")
    assert _state(sup, "pd") is MemberState.EXITED
    assert sup.tick(1000.0) == [] and spawn.count("pd") == 1


def test_a_failed_spawn_counts_as_a_death() -> None:
    spawn = Spawner()
    sup = Supervisor(spawn, RestartPolicy(max_deaths=2, death_window_s=60))
    sup.add("pd", 0.0)
    spawn.current("pd").returncode = 1
    sup.tick(1.0)
    spawn.fail_next = 5
    events = sup.tick(1.5)
    assert [e.kind for e in events] == [EventKind.DIED, EventKind.GAVE_UP]
    assert "could not be started: no more pids" in events[0].detail
    assert _state(sup, "pd") is MemberState.FAILED


def test_policy_and_names_are_checked() -> None:
    with pytest.raises(ValueError, match="initial_backoff_s <= max_backoff_s"):
        RestartPolicy(initial_backoff_s=20, max_backoff_s=10)
    with pytest.raises(ValueError, match="max_deaths"):
        RestartPolicy(max_deaths=0)
    sup = Supervisor(Spawner(), POLICY)
    sup.add("pd", 0.0)
    with pytest.raises(ValueError, match="already supervised"):
        sup.add("pd", 0.0)


def test_exit_descriptions() -> None:
    assert describe_exit(0) == "exit status 0"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-200) == "killed by signal 200"
    assert describe_exit(None) == "could not be started"
