"""``Launcher``: a whole deployment on one machine, as real supervised processes, stopped cleanly.

The gateway starts first (its client and control ports resolved if the file says 0), then one
worker process per site (``timed`` nodes of a site share a process; ``torch`` nodes get one each;
a ``vllm`` site's process is the sidecar of one vLLM server for all its nodes, and start-up waits
at least its ``startup_timeout_s``).
The resolved file (real ports, the key) is written to ``workdir`` (mode 0600) and every child reads
it, restarted children included, with the same arguments: a restarted gateway binds the same
ports, a restarted worker the file's node ports (fresh free ones where the file says 0; it
registers whatever it bound).

Supervision (``serve.supervisor``): with a ``RestartPolicy`` a watcher thread notices every death,
kills what is left of the dead child's process group and reaps it (``serve.process_group``: no
zombies, no signal to a recycled id), and starts
members of the desired set again with backoff; a member that keeps dying is reported and left
down. ``remove(name)`` takes a member out of the set before stopping it. Without a policy deaths are
reaped and reported, not restarted (what fault-injection tests want). The state of every member is
written to ``workdir/processes.json`` on each change (``serve.processes_file``; ``prfaas status``
shows it).

Every child runs in its own session (process group): stopping kills each group, SIGTERM then
SIGKILL after a grace period, so nothing is left behind even if a child spawned helpers; a
namespaced testbed (``netns: true``, ``serve.launch_netns``) is torn down. Each child's
stdout/stderr goes through a pipe into a size-capped, rotated ``NAME.log`` (``serve.childlog``).

Owns the desired set, its bookkeeping and the life cycle; its parts: the resolved file
(``serve.launch_resolved``), a child's command line and start (``serve.launch_child``), the
start-up waits (``serve.launch_wait``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.serve.childlog import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, LogPump, RotatingLog
from prfaas.serve.control_client import ControlClient
from prfaas.serve.launch_child import UP_CHILD_ENV, Child, serve_command, spawn
from prfaas.serve.launch_errors import LaunchCancelled, LaunchError
from prfaas.serve.launch_netns import namespaced
from prfaas.serve.launch_resolved import (
    RESOLVED_NAME,
    free_port,
    resolve_ports,
    with_node,
    without_node,
    write_resolved,
)
from prfaas.serve.launch_wait import Progress, wait_gateway, wait_nodes, wait_ready
from prfaas.serve.leftovers import sweep_dead_run
from prfaas.serve.process_group import ChildGroup, terminate
from prfaas.serve.processes_file import write_processes_file
from prfaas.serve.supervisor import (
    Event,
    EventKind,
    MemberState,
    MemberStatus,
    RestartPolicy,
    Supervisor,
    describe_exit,
)

STOP_GRACE_S = 5.0
VLLM_STOP_GRACE_S = 20.0
"""A vLLM site's node process stops its server's group (API server, EngineCore, Worker) before
it exits: more time than a prfaas worker needs, so it is not killed before it has done so."""
VLLM_READY_MARGIN_S = 30.0
"""On top of ``engine.vllm.startup_timeout_s``: the gateway, registration, the first reports."""
WATCH_PERIOD_S = 0.1
POLL_PERIOD_S = 0.1
log = logging.getLogger("prfaas.launcher")


class Launcher:
    def __init__(
        self,
        deployment: DeploymentConfig,
        workdir: Path,
        process_per_node: bool = False,
        restart: RestartPolicy | None = None,
        log_max_bytes: int = DEFAULT_MAX_BYTES,
        log_backups: int = DEFAULT_BACKUPS,
    ) -> None:
        self.testbed: Any = None
        if deployment.netns:
            # The PrfaaS site in its own namespace behind a shaped veth (``serve.launch_netns``).
            self.testbed, deployment = namespaced(deployment)
        self.deployment = resolve_ports(deployment)
        self.workdir = workdir
        self.process_per_node = process_per_node
        """Every site's nodes one per process (else only torch sites': see ``groups``)."""
        self.config_path = workdir / RESOLVED_NAME
        self.supervisor = Supervisor(self._spawn, restart)
        self.events: deque[tuple[float, Event]] = deque(maxlen=200)
        """Recent supervisor events with their wall time (newest last)."""
        self.on_event: Callable[[Event], None] | None = None
        self._log_cap = (log_max_bytes, log_backups)
        self._args: dict[str, list[str]] = {}
        self._logs: dict[str, RotatingLog] = {}
        self._procs: dict[str, ChildGroup] = {}
        self._pumps: list[LogPump] = []
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._cancel = threading.Event()
        """Set by ``cancel()`` (a signal handler): start-up stops at its next step. A flag, not
        an exception raised inside the handler: that could land between a child's spawn and its
        bookkeeping and leave the child running after ``stop()``."""
        self._watcher: threading.Thread | None = None
        self._control: ControlClient | None = None

    @property
    def url(self) -> str:
        g = self.deployment.gateway
        return f"http://{g.host}:{g.port}"

    @property
    def control_url(self) -> str:
        return self.control.url

    @property
    def control(self) -> ControlClient:
        """Signed client of the gateway's control listener (made on first use)."""
        if self._control is None:
            self._control = ControlClient(self.deployment)
        return self._control

    def groups(self) -> list[tuple[str, list[str]]]:
        """(process name, its nodes): one process per site, or per node where asked and at
        torch sites (each torch node is its own process). Decided per site: a torch site beside
        a vLLM site must not split the vLLM site into a server per node (two servers on its
        cores, and its local route no longer co-located)."""
        out: list[tuple[str, list[str]]] = []
        for site in self.deployment.sites:
            names = [n.name for n in site.nodes]
            torch = self.deployment.engine_for(site.name).kind == "torch"
            if self.process_per_node or torch:
                out.extend((n, [n]) for n in names)
            else:
                out.append((site.name, names))
        return out

    # -- life cycle ------------------------------------------------------------------------------
    def start(
        self, ready_timeout_s: float = 120.0, progress: Callable[[str], None] | None = None
    ) -> None:
        """Start everything and return once every node is in rotation and ``/ready`` says so.
        A child that dies meanwhile is a ``LaunchError`` with its log tail (no restarts yet).
        With vLLM sites the wait is at least their ``startup_timeout_s`` (and a margin)."""
        say = Progress(progress)
        deadline = time.monotonic() + max(ready_timeout_s, self._vllm_ready_s())
        self.workdir.mkdir(parents=True, exist_ok=True)
        for line in sweep_dead_run(self.workdir, self.config_path):
            say(f"a dead run in this workdir left {line} running: stopped it")
        self._write_resolved()
        try:
            # The workers start once the gateway answers, not beside it (which saved ~1.3 s of a
            # 4.5-5.4 s start on 2 cores): the gateway's resolved ports are free, not yet bound,
            # and a node's own port-0 listener, or its connection to a port nothing listens on
            # yet, can be given one of them; the gateway then cannot bind it ("Address already
            # in use": fresh-clone CI, 2026-12-07).
            self._add("gateway", ["--role", "gateway"])
            self._wait_gateway(deadline, say)
            for name, nodes in self.groups():
                args = ["--role", "node"]
                for n in nodes:
                    args += ["--node", n]
                self._check_cancelled()
                self._add(name, args)
            self._wait_nodes(deadline, None, say)
            self._wait_ready(deadline, say)
        except BaseException:
            self.stop()
            raise
        self._watcher = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._watcher.start()

    def _vllm_ready_s(self) -> float:
        d = self.deployment
        waits = [
            d.engine_for(s.name).vllm.startup_timeout_s + VLLM_READY_MARGIN_S
            for s in d.sites
            if d.engine_for(s.name).kind == "vllm"
        ]
        return max(waits, default=0.0)

    @property
    def stop_grace_s(self) -> float:
        """How long a stopped child may take before it is killed."""
        d = self.deployment
        vllm = any(d.engine_for(s.name).kind == "vllm" for s in d.sites)
        return VLLM_STOP_GRACE_S if vllm else STOP_GRACE_S

    def cancel(self) -> None:
        """Stop a ``start()`` in progress at its next step (safe from a signal handler); it then
        raises ``LaunchCancelled`` after stopping what it started."""
        self._cancel.set()

    def _check_cancelled(self) -> None:
        if self._cancel.is_set():
            raise LaunchCancelled("start-up cancelled")

    def _pause(self) -> None:
        """One poll period of a start-up wait, cut short by ``cancel()``."""
        if self._cancel.wait(POLL_PERIOD_S):
            raise LaunchCancelled("start-up cancelled")

    def _write_resolved(self) -> None:
        write_resolved(self.config_path, self.deployment)

    def _add(self, name: str, args: list[str]) -> None:
        with self._lock:
            self._args[name] = args
            self._report(self.supervisor.add(name, time.monotonic()))

    def _spawn(self, name: str) -> ChildGroup:
        """Start (or restart) member ``name``: the same arguments, the resolved file."""
        cmd, args = serve_command(
            self.config_path, self.deployment, self.testbed, name, self._args[name]
        )
        log_ = self._logs.get(name)
        if log_ is None:
            log_ = self._logs[name] = RotatingLog(self.workdir / f"{name}.log", *self._log_cap)
        log_.write(f"--- prfaas launcher: starting {name}: {' '.join(args)}\n".encode())
        handle, pump = spawn(cmd + args, log_, name, extra_env=UP_CHILD_ENV)
        self._procs[name] = handle
        self._pumps = [p for p in self._pumps if not p.join(0)]
        self._pumps.append(pump)
        return handle

    def _check_alive(self) -> None:
        with self._lock:
            for name in self.supervisor.names():
                code = self._procs[name].poll()
                if code is not None:
                    raise LaunchError(
                        f"process {name} {describe_exit(code)} during start-up "
                        f"(log {self._logs[name].path}):\n" + self._logs[name].tail()
                    )

    def _wait_gateway(self, deadline: float, say: Progress) -> None:
        def workers() -> int:
            return len(self.groups())

        wait_gateway(self.url, workers, deadline, say, self._check_alive, self._pause)

    def nodes(self) -> list[dict[str, Any]]:
        """``GET /internal/nodes`` (signed, on the control listener)."""
        return self.control.nodes()

    def routes(self) -> list[dict[str, Any]]:
        """``GET /internal/routes`` (signed, on the control listener): what each request did."""
        return self.control.routes()

    def wait_nodes(self, timeout_s: float, names: list[str] | None = None) -> None:
        """Until the named nodes (default: all) are registered and in rotation."""
        self._wait_nodes(time.monotonic() + timeout_s, names, Progress(None))

    def _wait_nodes(self, deadline: float, names: list[str] | None, say: Progress) -> None:
        wanted = set(names or [n.name for s in self.deployment.sites for n in s.nodes])
        wait_nodes(self.nodes, wanted, deadline, say, self._check_alive_in_start_up, self._pause)

    def _check_alive_in_start_up(self) -> None:
        if self._watcher is None:
            self._check_alive()  # during start-up a death is fatal

    def _wait_ready(self, deadline: float, say: Progress) -> None:
        def ready() -> str | None:
            return self.control.ready()

        wait_ready(ready, self.url, deadline, say, self._check_alive, self._pause)

    # -- supervision -----------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_PERIOD_S):
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._report(self.supervisor.tick(time.monotonic()))
                except Exception:  # one bad tick must not end supervision for the whole run
                    log.exception("supervisor tick")

    def _report(self, events: list[Event]) -> None:
        for event in events:
            level = logging.ERROR if event.kind is EventKind.GAVE_UP else logging.WARNING
            if event.kind is EventKind.STARTED and "restarted" not in event.detail:
                level = logging.INFO
            log.log(level, "%s: %s", event.member, event.detail)
            if event.member in self._logs and event.kind is not EventKind.STARTED:
                self._logs[event.member].write(
                    f"--- prfaas launcher: {event.member} {event.detail}\n".encode()
                )
            self.events.append((time.time(), event))
            if self.on_event is not None:
                self.on_event(event)
        if events:
            self._write_processes()

    def status(self) -> tuple[MemberStatus, ...]:
        with self._lock:
            return self.supervisor.status()

    def _write_processes(self, stopped: bool = False) -> None:
        write_processes_file(
            self.workdir, self.supervisor.status(), self._logs, self.events, stopped
        )

    def child(self, name: str) -> Child:
        with self._lock:
            return Child(name, self._procs[name].proc, self._logs[name])

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one process group (fault injection) and wait until its leader is dead and
        reaped; with a restart policy the watcher starts it again."""
        with self._lock:  # the watcher cannot reap it between our look and our kill
            handle = self._procs[name]
            if handle.poll() is None:
                handle.signal_group(sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            with self._lock:
                if handle.poll() is not None:
                    return
            time.sleep(0.02)
        raise LaunchError(f"{name} (pid {handle.pid}) still alive {STOP_GRACE_S:g} s after {sig}")

    def add_node(self, site: str, name: str, role: str = "prefill") -> None:
        """Add a node to ``site`` at run time (an elastic pool's provider): it joins the resolved
        file (a free port, like every node the file leaves at 0) and the desired set as a process
        of its own; ``remove(name)`` takes it out again."""
        with self._lock:
            self.deployment = with_node(self.deployment, site, name, role)
            self._write_resolved()
        self._add(name, ["--role", "node", "--node", name])

    def remove(self, name: str, grace_s: float | None = None) -> None:
        """Take ``name`` out of the desired set, then stop its process group (SIGTERM, SIGKILL
        after ``grace_s``, by default ``stop_grace_s``): it stays down. A node of that name
        leaves the resolved file too (every later reader of it, ``prfaas status`` or ``prfaas
        sim``, would count it as the deployment's)."""
        with self._lock:
            proc, events = self.supervisor.remove(name, time.monotonic())
            self._report(events)
            left = without_node(self.deployment, name)
            if left is not None:
                self.deployment = left
                self._write_resolved()
        if proc is not None:
            assert isinstance(proc, ChildGroup)
            terminate([proc], self.stop_grace_s if grace_s is None else grace_s)

    def stop(self) -> None:
        self._stopping.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        with self._lock:
            procs = list(self._procs.values())
        terminate(list(reversed(procs)), self.stop_grace_s)  # workers first, the gateway last
        for pump in self._pumps:
            pump.join(2.0)
        if self.workdir.exists():
            self._write_processes(stopped=True)
        for name in list(self.supervisor.names()):
            self.supervisor.remove(name, time.monotonic())
        for log_ in self._logs.values():
            log_.close()
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.testbed is not None:
            self.testbed.teardown()  # namespaces, veth, delay line
            self.testbed = None

    def __enter__(self) -> Launcher:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = [
    "Child",
    "LaunchCancelled",
    "LaunchError",
    "Launcher",
    "MemberState",
    "RestartPolicy",
    "free_port",  # its home is serve.launch_resolved; pool/launcher.py imports it from here
]
