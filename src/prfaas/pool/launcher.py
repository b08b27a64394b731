"""``PoolLauncher``: a pool on one machine (``prfaas up pool.yaml``), as supervised processes.

The same supervision as a deployment's (``serve.supervisor``, ``serve.process_group``,
``serve.childlog``, ``serve.processes_file``: restarts with backoff, rotated per-process logs,
``processes.json`` for ``prfaas status``, every child in its own process group, SIGTERM then
SIGKILL on stop): the front door first (``pool.service``), then the node processes
(``pool.node_main``; timed and torch groups: vLLM groups are refused at start): one per node
group, named after the group, or, for a group with ``processes: per_node`` (the default of a
group with ``notice_s``), one per node, named after the node, from a one-node file
(``pool.nodes_file.one_node_deployment``), so a spot notice to one node leaves the others of its
group serving. A group's ``cpus`` goes into its node files' ``engine.cpus``, and each of its node
processes pins itself to those cores at start, as a deployment's node processes do
(``pool.node_main``). The workdir's files (``pool.resolved``) carry real ports and a fresh internal
key; start-up returns once the front door answers and every node of the file has registered with
it and is live.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx

from prfaas.errors import UsageError
from prfaas.pool.nodes_file import group_deployment, one_node_deployment
from prfaas.pool.resolved import (
    KEY_NAME,
    POOL_NAME,
    nodes_name,
    tenant_keys,
    write_private,
    write_yaml,
)
from prfaas.pool_sections import PoolFileConfig
from prfaas.serve.childlog import LogPump, RotatingLog
from prfaas.serve.launch_child import spawn
from prfaas.serve.launch_errors import LaunchCancelled, LaunchError
from prfaas.serve.launcher import STOP_GRACE_S, free_port
from prfaas.serve.process_group import ChildGroup, terminate
from prfaas.serve.processes_file import write_processes_file
from prfaas.serve.supervisor import Event, MemberStatus, RestartPolicy, Supervisor, describe_exit

FRONT_DOOR = "frontdoor"
POLL_S = 0.1
log = logging.getLogger("prfaas.launcher")


class PoolLauncher:
    def __init__(
        self,
        pool: PoolFileConfig,
        pool_path: Path,
        workdir: Path,
        restart: RestartPolicy | None = None,
    ) -> None:
        for i, g in enumerate(pool.groups):
            if g.kind == "vllm":
                raise UsageError(
                    f"{pool_path}: groups.{i}.kind: 'vllm' pool nodes do not run live yet "
                    "(timed and torch groups do; docs/pool.md)"
                )
        conflict = pool.clock_conflict()
        if conflict is not None:
            raise UsageError(f"{pool_path}: {conflict}")
        self.pool = _resolved(pool, pool_path.resolve().parent)
        self.pool_path = pool_path
        self._file_pool = pool
        """The operator's file as last read (what a reload compares the new one with)."""
        self.workdir = workdir
        self.supervisor = Supervisor(self._spawn, restart)
        self.events: list[tuple[float, Event]] = []
        self._args: dict[str, list[str]] = {}
        self._logs: dict[str, RotatingLog] = {}
        self._procs: dict[str, ChildGroup] = {}
        self._pumps: list[LogPump] = []
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._cancel = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def url(self) -> str:
        door = self.pool.front_door
        return f"{door.scheme}://{door.host}:{door.port}"

    @property
    def control_url(self) -> str:
        door = self.pool.front_door
        return f"http://{door.host}:{door.control_port}"

    def start(self, ready_timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + ready_timeout_s
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_files()
        try:
            self._add(FRONT_DOOR, front_door_args(self.workdir))
            self._wait(deadline, lambda h: True, "the front door to answer")
            for name, group, node in node_processes(self.pool):
                self._add(name, node_group_args(self.workdir, group, node=node))
            wanted = sum(len(g.node_names) for g in self.pool.groups)
            self._wait(deadline, lambda h: int(h["nodes_live"]) >= wanted,
                       f"{wanted} pool nodes to register")  # fmt: skip
        except BaseException:
            self.stop()
            raise
        self._watcher = threading.Thread(target=self._watch, name="pool-supervisor", daemon=True)
        self._watcher.start()

    def cancel(self) -> None:
        """Stop a ``start()`` in progress at its next poll (safe from a signal handler)."""
        self._cancel.set()

    def _write_files(self) -> None:
        write_yaml(self.workdir / POOL_NAME, self.pool.model_dump(mode="json"))
        key = os.urandom(24).hex()
        write_private(self.workdir / KEY_NAME, key + "\n")
        for g in self.pool.groups:
            if not g.per_node_processes:
                d = group_deployment(self.pool, g, key)
                write_yaml(self.workdir / nodes_name(g.name), d.model_dump(mode="json"))
                continue
            for node in g.node_names:
                d = one_node_deployment(self.pool, g, node, key)
                write_yaml(self.workdir / nodes_name(g.name, node), d.model_dump(mode="json"))

    def _wait(self, deadline: float, done: object, what: str) -> None:
        assert callable(done)
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                r = httpx.get(f"{self.control_url}/health", timeout=1.0, trust_env=False)
                if r.status_code == 200 and done(r.json()):
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if self._cancel.wait(POLL_S):
                raise LaunchCancelled("start-up cancelled")
        raise LaunchError(f"timed out waiting for {what} ({self.control_url}/health)")

    def _add(self, name: str, args: list[str]) -> None:
        with self._lock:
            self._args[name] = args
            self._report(self.supervisor.add(name, time.monotonic()))

    def _spawn(self, name: str) -> ChildGroup:
        log_ = self._logs.get(name)
        if log_ is None:
            log_ = self._logs[name] = RotatingLog(self.workdir / f"{name}.log")
        log_.write(f"--- prfaas pool launcher: starting {name}\n".encode())
        # No extra environment: the pool's children are not `prfaas serve` (``UP_CHILD_ENV``).
        handle, pump = spawn([sys.executable, *self._args[name]], log_, name, extra_env={})
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

    def _watch(self) -> None:
        while not self._stopping.wait(POLL_S):
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._report(self.supervisor.tick(time.monotonic()))
                except Exception:
                    log.exception("supervisor tick")

    def _report(self, events: list[Event]) -> None:
        for event in events:
            log.warning("%s: %s", event.member, event.detail)
            self.events.append((time.time(), event))
        if events:
            write_processes_file(self.workdir, self.supervisor.status(), self._logs,
                                 self.events[-200:], False)  # fmt: skip

    def reload(self, timeout_s: float = 5.0) -> str:
        """Read the operator's pool file again and apply its ``tenants`` (keys, weights, caps)
        to the running pool: the resolved file is rewritten, then the front door and every node
        process get SIGHUP (``pool.service.TenantReload``, ``pool.node_main``), and this waits
        until the front door says it reloaded. Returns what changed, said in one line; a file
        that does not load is a ``UsageError`` naming the field, and nothing changes. Other
        sections are not reloaded (ports, groups and egress are held by running processes): a
        change there is named in the answer, for a restart."""
        from prfaas.pool_file import load_pool

        new = load_pool(self.pool_path)
        resolved = _resolved(new, self.pool_path.resolve().parent)
        pool = PoolFileConfig.model_validate(
            {**self.pool.model_dump(mode="json"),
             "tenants": [t.model_dump(mode="json") for t in resolved.tenants]}
        )  # fmt: skip
        unresolved: list[str] = []  # named in the answer; the front door leaves them out
        tenant_keys(pool, self.workdir, on_missing=unresolved.append)  # none: UsageError
        others = [
            name for name in PoolFileConfig.model_fields
            if name != "tenants" and getattr(new, name) != getattr(self._file_pool, name)
        ]  # fmt: skip
        before = self._key_reloads()
        with self._lock:
            write_yaml(self.workdir / POOL_NAME, pool.model_dump(mode="json"))
            self.pool, self._file_pool = (
                pool,
                new.model_copy(update={n: getattr(self._file_pool, n) for n in others}),
            )
            for name in self.supervisor.names():
                if self._procs[name].poll() is None:
                    self._procs[name].signal_group(signal.SIGHUP)
        said = said_of(pool, others) + "".join(f"; {why}" for why in unresolved)
        if before is None:
            return said + " (the front door does not answer now: it reads them when it is back)"
        deadline = time.monotonic() + timeout_s
        while (after := self._key_reloads()) is None or after <= before:
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"the front door did not reload within {timeout_s:g} s "
                    f"(log {self._logs[FRONT_DOOR].path})"
                )
            time.sleep(POLL_S)
        return said

    def _key_reloads(self) -> int | None:
        """The front door's reload count (its operator listener), None when it does not answer."""
        from prfaas.serve.auth import SignedAuth

        try:
            r = httpx.get(
                f"{self.control_url}/internal/tenants", timeout=2.0, trust_env=False,
                auth=SignedAuth((self.workdir / KEY_NAME).read_text().strip().encode()),
            )  # fmt: skip
            return int(r.json()["key_reloads"]) if r.status_code == 200 else None
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            return None

    def status(self) -> tuple[MemberStatus, ...]:
        with self._lock:
            return self.supervisor.status()

    def kill(self, name: str, sig: int) -> None:
        """Signal one member's process group (fault injection); with a restart policy the
        watcher starts it again."""
        with self._lock:
            self._procs[name].signal_group(sig)

    def stop(self) -> None:
        self._stopping.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        with self._lock:
            procs = list(self._procs.values())
        terminate(list(reversed(procs)), STOP_GRACE_S)  # the nodes first, the front door last
        for pump in self._pumps:
            pump.join(2.0)
        if self.workdir.exists():
            write_processes_file(self.workdir, self.supervisor.status(), self._logs,
                                 self.events[-200:], True)  # fmt: skip
        for name in list(self.supervisor.names()):
            self.supervisor.remove(name, time.monotonic())
        for log_ in self._logs.values():
            log_.close()


def front_door_args(workdir: Path) -> list[str]:
    """The front door's process (after the interpreter): what ``start`` runs and a Kubernetes
    front door pod execs (``k8s.pool_entry``)."""
    return ["-m", "prfaas.pool.service", str(workdir)]


def node_group_args(
    workdir: Path, group: str, host: str | None = None, node: str | None = None
) -> list[str]:
    """A node group's process, or with ``node`` that node's own (``nodes_name(group, node)``);
    ``host``: the address its nodes bind and advertise (default: the front door's host, as on
    one machine; a Kubernetes pod gives its own IP)."""
    return ["-m", "prfaas.pool.node_main", str(workdir), group, *([host] if host else []),
            *(["--node", node] if node else [])]  # fmt: skip


def node_processes(pool: PoolFileConfig) -> list[tuple[str, str, str | None]]:
    """(process name, group, node or None) of every node process of the pool: one per group
    (named after it), or one per node (named after the node) for a group whose nodes run in
    processes of their own (``PoolGroup.per_node_processes``)."""
    out: list[tuple[str, str, str | None]] = []
    for g in pool.groups:
        if g.per_node_processes:
            out += [(node, g.name, node) for node in g.node_names]
        else:
            out.append((g.name, g.name, None))
    return out


def said_of(pool: PoolFileConfig, not_reloaded: list[str]) -> str:
    said = "; ".join(f"{t.name}: keys {', '.join(k.id for k in t.keys)}" for t in pool.tenants)
    if not_reloaded:
        said += f" (not reloaded, restart the pool for: {', '.join(not_reloaded)})"
    return said


def _resolved(pool: PoolFileConfig, base_dir: Path) -> PoolFileConfig:
    """Real ports for the ones the file leaves at 0; key files as absolute paths."""
    door = pool.front_door
    ports = {
        "port": door.port or free_port(door.host),
        "control_port": door.control_port or free_port(door.host),
    }

    def absolute(name: str) -> str:
        return str(base_dir / name)  # an absolute name stays itself

    tenants = [
        t.model_copy(update={
            "keys": [k if k.file is None else k.model_copy(update={"file": absolute(k.file)})
                     for k in t.keys],
            "receivers_tls": None if t.receivers_tls is None else t.receivers_tls.model_copy(
                update={"ca": absolute(t.receivers_tls.ca)}),
        })
        for t in pool.tenants
    ]  # fmt: skip
    tls = door.tls
    if tls is not None:
        tls = tls.model_copy(update={"cert": absolute(tls.cert), "key": absolute(tls.key)})
    door = door.model_copy(update={**ports, "tls": tls})
    return pool.model_copy(update={"front_door": door, "tenants": tenants})
