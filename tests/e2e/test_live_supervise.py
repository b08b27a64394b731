"""``prfaas up`` supervises: a SIGKILLed gateway or worker is restarted and the deployment serves
again, dead children are reaped (no zombies), ``prfaas status`` / ``prfaas drain`` work on the
resolved file, a crash-looping member is left down, and stopping leaves no process behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from prfaas.config import DeploymentConfig, load_deployment
from prfaas.serve.control_client import ControlClient
from prfaas.serve.launcher import Launcher, LaunchError, RestartPolicy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "two-site.yaml"
NODES = {"pf0", "p0", "d0", "d1"}


def deployment_file(tmp_path: Path, **gateway: Any) -> Path:
    """``examples/two-site.yaml`` on free ports, fast heartbeats, a fixed threshold."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["engine"].update(time_scale=0.05, token_chunk=16)
    raw["gateway"] = {"port": 0, "control_port": 0, "heartbeat_timeout_s": 1.5, **gateway}
    raw["policy"] = {"router": "threshold", "threshold_tokens": 8192}
    raw["heartbeat_interval_s"] = 0.2
    path = tmp_path / "two-site.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def until(what: str, check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


def prfaas(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prfaas.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )


def complete(url: str, prompt: str = "hello", max_tokens: int = 8) -> int:
    body = {"model": "paper-1t", "prompt": prompt, "max_tokens": max_tokens}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code


def children_of(pid: int) -> list[tuple[int, str, int]]:
    """(pid, state, process group) of every process whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            out.append((int(entry.name), fields[0], int(fields[2])))
    return out


def alive_in_groups(groups: set[int]) -> list[int]:
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) in groups and fields[0] != "Z":
                alive.append(int(entry.name))
    return alive


class Up:
    """``prfaas up`` as a user runs it, in its own process group."""

    def __init__(self, path: Path, workdir: Path, *extra: str) -> None:
        self.workdir = workdir
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prfaas.cli",
                "up",
                str(path),
                "--workdir",
                str(workdir),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.groups: set[int] = set()

    def wait_for(self, needle: str, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("prfaas up exited:\n" + "".join(self.lines))
            self.lines.append(line)
            if needle in line:
                return line
        raise AssertionError(f"no {needle!r} from prfaas up:\n" + "".join(self.lines))

    def processes(self) -> dict[str, dict[str, Any]]:
        doc = json.loads((self.workdir / "processes.json").read_text())
        procs = {p["name"]: p for p in doc["processes"]}
        self.groups |= {p["pid"] for p in procs.values() if p["pid"]}
        # every start, also of processes that died or were stopped since ("started, pid N")
        self.groups |= {int(e["detail"].rsplit(" ", 1)[1]) for e in doc["events"]
                        if e["kind"] == "started"}  # fmt: skip
        return procs

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        for group in self.groups:  # whatever the test left: never leak processes
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        return self.proc.wait()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    runner = Up(deployment_file(tmp_path), tmp_path / "work")
    try:
        yield runner
    finally:
        runner.stop()


def _nodes(resolved: Path) -> dict[str, dict[str, Any]]:
    r = prfaas("status", str(resolved), "--json")
    if r.returncode != 0:
        raise ValueError(r.stderr)  # `until` retries: the gateway may be restarting
    return {n["node"]: n for n in json.loads(r.stdout)["nodes"]}


def _http_ports(resolved: Path) -> dict[str, int]:
    with ControlClient(load_deployment(resolved)) as client:
        return {ep["node"]: ep["http_port"] for ep in client.endpoints()}


def _all_in_rotation(resolved: Path) -> bool:
    nodes = _nodes(resolved)
    return set(nodes) == NODES and all(n["in_rotation"] for n in nodes.values())


@pytest.mark.timeout(180)
def test_up_restarts_what_dies_and_stops_clean(up: Up) -> None:
    up.wait_for("prfaas: ready:")
    url = up.wait_for("OpenAI endpoint").split()[-1].removesuffix("/v1")
    resolved = Path(up.wait_for("resolved deployment").split()[3])
    assert resolved == up.workdir / "deployment.resolved.yaml"
    assert resolved.stat().st_mode & 0o077 == 0  # it holds the key
    assert complete(url) == 200

    status = json.loads(prfaas("status", str(resolved), "--json").stdout)
    assert status["gateway"]["ready"] and status["routes"]
    assert {p["name"]: p["state"] for p in status["processes"]["processes"]} == {
        "gateway": "running", "prfaas": "running", "pd": "running",
    }  # fmt: skip

    # the gateway SIGKILLed: restarted on the same ports, the nodes register again, it serves
    gateway = up.processes()["gateway"]["pid"]
    os.killpg(gateway, signal.SIGKILL)
    until("gateway restarted", lambda: up.processes()["gateway"]["restarts"] == 1)
    until("nodes back in rotation", lambda: _all_in_rotation(resolved))
    assert complete(url) == 200

    # a worker SIGKILLed: reaped (no zombie among up's children), restarted, rejoins
    pd = up.processes()["pd"]["pid"]
    before = _http_ports(resolved)
    os.killpg(pd, signal.SIGKILL)
    until("pd restarted", lambda: up.processes()["pd"]["restarts"] == 1)
    assert up.processes()["pd"]["last_exit"] == "killed by SIGKILL"
    # the new process registered (its port is new: the file says 0), then its nodes serve
    until("pd re-registered", lambda: all(
        _http_ports(resolved)[n] != before[n] for n in ("p0", "d0", "d1")))  # fmt: skip
    until("pd's nodes back", lambda: _all_in_rotation(resolved))
    assert [c for c in children_of(up.proc.pid) if c[1] == "Z"] == []
    assert pd not in {c[0] for c in children_of(up.proc.pid)}
    assert complete(url) == 200

    # drain: out of rotation, idle, reported; resume puts it back
    r = prfaas("drain", str(resolved), "d0", "--timeout", "20")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "d0 is idle" in r.stdout
    d0 = _nodes(resolved)["d0"]
    assert not d0["in_rotation"] and d0["in_flight"] == 0
    assert complete(url) == 200  # d1 serves meanwhile
    r = prfaas("drain", "--resume", str(resolved), "d0")
    assert r.returncode == 0, r.stderr
    until("d0 back in rotation", lambda: _nodes(resolved)["d0"]["in_rotation"])

    up.processes()
    text = prfaas("status", str(resolved))
    assert text.returncode == 0 and "PROCESS" in text.stdout and "killed by SIGKILL" in text.stdout
    assert up.stop() == 0
    assert up.proc.stdout is not None and "prfaas: stopped" in up.proc.stdout.read()
    assert alive_in_groups(up.groups) == []
    final = json.loads((up.workdir / "processes.json").read_text())
    assert final["stopped"] is True
    logs = {p.name for p in up.workdir.glob("*.log")}
    assert logs == {"gateway.log", "prfaas.log", "pd.log"}
    assert "prfaas launcher: gateway killed by SIGKILL" in (up.workdir / "gateway.log").read_text()


@pytest.mark.timeout(120)
def test_status_and_drain_errors_name_what_is_wrong(tmp_path: Path) -> None:
    path = deployment_file(tmp_path)
    r = prfaas("status", str(path))
    assert r.returncode == 2 and "gateway.port and gateway.control_port are 0" in r.stderr
    raw = yaml.safe_load(path.read_text())
    raw["gateway"].update(port=1, control_port=9)  # nothing listens there
    path.write_text(yaml.safe_dump(raw))
    r = prfaas("status", str(path))
    assert r.returncode == 1 and "not reachable at http://127.0.0.1:9" in r.stderr
    r = prfaas("drain", str(path), "nope")
    assert r.returncode == 2 and "no node named 'nope'" in r.stderr
    del raw["psk"]
    path.write_text(yaml.safe_dump(raw))
    r = prfaas("status", str(path))
    assert r.returncode == 2 and "psk" in r.stderr and "Traceback" not in r.stderr


def _config(tmp_path: Path) -> DeploymentConfig:
    return DeploymentConfig.model_validate(yaml.safe_load(deployment_file(tmp_path).read_text()))


@pytest.mark.timeout(120)
def test_wrong_key_is_refused_by_name(tmp_path: Path) -> None:
    launcher = Launcher(_config(tmp_path), tmp_path / "w")
    try:
        launcher.start(ready_timeout_s=60)
        raw = yaml.safe_load(launcher.config_path.read_text())
        raw["psk"] = "another-key-0123456789"
        other = tmp_path / "other.yaml"
        other.write_text(yaml.safe_dump(raw))
        r = prfaas("status", str(other))
        assert r.returncode == 2 and "refused the key (psk)" in r.stderr, r.stderr
    finally:
        launcher.stop()


@pytest.mark.timeout(120)
def test_crash_loop_is_left_down_and_removed_member_stays_down(tmp_path: Path) -> None:
    policy = RestartPolicy(initial_backoff_s=0.1, max_backoff_s=0.2, max_deaths=2)
    launcher = Launcher(_config(tmp_path), tmp_path / "w", restart=policy)
    groups: set[int] = set()
    try:
        launcher.start(ready_timeout_s=60)
        for _ in range(2):
            until("pd running", lambda: launcher.child("pd").proc.returncode is None
                  and _state(launcher, "pd") == "running")  # fmt: skip
            groups.add(launcher.child("pd").proc.pid)
            launcher.kill("pd")
        until("pd given up", lambda: _state(launcher, "pd") == "failed")
        time.sleep(0.5)  # several backoffs' worth: it is not started again
        assert _state(launcher, "pd") == "failed" and alive_in_groups(groups) == []
        groups.add(launcher.child("prfaas").proc.pid)
        launcher.remove("prfaas")  # out of the set first, then stopped: never restarted
        time.sleep(0.5)
        assert "prfaas" not in launcher.supervisor and alive_in_groups(groups) == []
        events = [(e.member, e.kind.value) for _, e in launcher.events]
        assert ("pd", "gave_up") in events and ("prfaas", "removed") in events
        doc = json.loads((launcher.workdir / "processes.json").read_text())
        assert {p["name"]: p["state"] for p in doc["processes"]} == {
            "gateway": "running", "pd": "failed",
        }  # fmt: skip
    finally:
        groups |= {launcher.child("gateway").proc.pid}
        launcher.stop()
    assert alive_in_groups(groups) == []
    assert [c for c in children_of(os.getpid()) if c[1] == "Z"] == []


def _state(launcher: Launcher, name: str) -> str:
    return next(m.state.value for m in launcher.status() if m.name == name)


@pytest.mark.timeout(120)
def test_a_child_dying_during_start_up_is_reported_with_its_log(tmp_path: Path) -> None:
    raw = yaml.safe_load(deployment_file(tmp_path).read_text())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        raw["sites"][0]["nodes"][0]["port"] = port  # pf0 cannot bind its HTTP port
        launcher = Launcher(DeploymentConfig.model_validate(raw), tmp_path / "w")
        with pytest.raises(LaunchError) as info:
            launcher.start(ready_timeout_s=60)
    message = str(info.value)
    assert "process prfaas exit status" in message and "during start-up" in message
    assert "Address already in use" in message  # the log tail
    assert [c for c in children_of(os.getpid()) if c[1] == "Z"] == []


@pytest.mark.timeout(120)
def test_sigterm_during_start_up_stops_what_was_started(up: Up) -> None:
    up.wait_for("gateway answering")  # the workers are being started
    started = up.processes()  # the gateway, and the workers spawned so far
    os.kill(up.proc.pid, signal.SIGTERM)
    assert up.proc.wait(timeout=30) == 0
    up.processes()  # every member that was started, from the events
    assert started and len(up.groups) >= 1 and alive_in_groups(up.groups) == []
    assert json.loads((up.workdir / "processes.json").read_text())["stopped"] is True
    # Also children the launcher may not have recorded: a signal raised between a spawn and its
    # bookkeeping once left a worker running (seen 2 runs in 3 before the handler became a flag).
    assert processes_using(up.workdir) == []


def processes_using(workdir: Path) -> list[str]:
    """Command lines of live processes that name ``workdir`` (its resolved deployment file)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(workdir) in cmdline and state != "Z":
            found.append(f"{proc.name}: {cmdline}")
    return found


@pytest.mark.timeout(120)
def test_up_stops_and_fails_when_the_gateway_keeps_dying(tmp_path: Path) -> None:
    up = Up(deployment_file(tmp_path), tmp_path / "work", "--max-deaths", "1")
    try:
        up.wait_for("prfaas: ready:")
        os.killpg(up.processes()["gateway"]["pid"], signal.SIGKILL)
        up.wait_for("prfaas: stopped")
        assert up.proc.wait(timeout=30) == 1
        assert up.proc.stdout is not None
        rest = up.proc.stdout.read()
        assert "the gateway kept dying" in rest, "".join(up.lines) + rest
        assert any("gateway: 1 deaths within 60 s" in line for line in up.lines)
        up.processes()
        assert alive_in_groups(up.groups) == []
    finally:
        up.stop()


@pytest.mark.timeout(120)
def test_a_rerun_stops_what_a_killed_prfaas_up_left_running(tmp_path: Path) -> None:
    """``prfaas up`` SIGKILLed (the launcher alone): its children live on in their own sessions.
    ``prfaas up`` again in the same workdir stops them first (``serve.leftovers``), says so, and
    serves; stopped, it leaves nothing of either run."""
    path, workdir = deployment_file(tmp_path), tmp_path / "work"
    first = Up(path, workdir)
    second: Up | None = None
    try:
        first.wait_for("prfaas: ready:")
        first.processes()  # remember its groups
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
        assert alive_in_groups(first.groups), "the children died with the launcher"
        second = Up(path, workdir)
        line = second.wait_for("a dead run in this workdir left")
        assert "stopped it" in line
        second.wait_for("prfaas: ready:")
        until("the first run's processes gone", lambda: alive_in_groups(first.groups) == [])
        url = second.wait_for("OpenAI endpoint").split()[-1].removesuffix("/v1")
        assert complete(url) == 200
        second.processes()
        assert second.stop() == 0
        assert alive_in_groups(second.groups) == []
    finally:
        first.stop()
        if second is not None:
            second.stop()
