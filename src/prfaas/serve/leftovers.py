"""``sweep_dead_run``: what a ``prfaas up`` that died without stopping its children (SIGKILL,
the OOM killer) left running in its workdir, found and stopped before the next run starts there.

Each child runs in a session of its own (so a signal to the launcher's group does not reach it)
and survives a launcher killed outright: the gateway and node processes keep their ports and
heartbeat, and a vLLM sidecar's server keeps its memory. The workdir says what they were: its
``processes.json`` (the launcher's pid, each member's name and pid, not marked stopped) and the
resolved file every child was started with (``serve --config PATH``). A member is stopped only if
its pid is still a process whose command line names that resolved file (a reused pid is left
alone); a vLLM server only if its environment carries the owner tag of one of the run's sidecars
(``vllm.server.owner_tag``: process name, key, the old run's control address, which a run with
``control_port: 0`` does not share with the next one), and with it the private folder its dead
sidecar gave it (``vllm.server.private_folder_of``). Nothing is touched while the old launcher
still lives (another ``prfaas up`` in the same workdir), or when the old run stopped cleanly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from prfaas.serve.process_group import pid_alive
from prfaas.serve.processes_file import PROCESSES_NAME


def sweep_dead_run(workdir: Path, config_path: Path) -> list[str]:
    """Stop what a dead run in ``workdir`` (started with ``config_path``) left; returns what was
    stopped, one line each (empty: nothing, or nothing to know it by)."""
    try:
        doc = json.loads((workdir / PROCESSES_NAME).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict) or doc.get("stopped"):
        return []
    launcher = doc.get("launcher_pid")
    if isinstance(launcher, int) and launcher != os.getpid() and pid_alive(launcher):
        return []
    members = [p for p in doc.get("processes", []) if isinstance(p, dict)]
    stopped: list[str] = []
    for m in members:
        pid = m.get("pid")
        if isinstance(pid, int) and str(config_path) in _cmdline(pid) and _kill_group(pid):
            stopped.append(f"{m.get('name')} (pid {pid})")
    from prfaas.serve.vllm.server import private_folder_of

    for name, pid in _vllm_servers(members, config_path):
        folder = private_folder_of(pid)  # its dead sidecar's sockets
        if _kill_group(pid):
            stopped.append(f"{name}'s vLLM server (pid {pid})")
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return stopped


def _vllm_servers(members: list[dict[str, Any]], config_path: Path) -> list[tuple[str, int]]:
    """(member, pid) of live vLLM servers carrying the owner tag of one of the old run's
    sidecars: its process name is its nodes' (a site's member runs the site's nodes)."""
    from prfaas.config import load_deployment
    from prfaas.errors import UsageError
    from prfaas.serve.node.control_plane import default_process_name
    from prfaas.serve.vllm.server import find_orphans, owner_tag

    try:
        old = load_deployment(config_path)
    except (UsageError, OSError):
        return []
    if not any(old.engine_for(s.name).kind == "vllm" for s in old.sites):
        return []
    sites = {s.name: [n.name for n in s.nodes] for s in old.sites}
    found: list[tuple[str, int]] = []
    for m in members:
        name = str(m.get("name"))
        nodes = sites.get(name, [name])
        tag = owner_tag(default_process_name(nodes), old.psk, old.control_url)
        found.extend((name, pid) for pid in find_orphans(tag))
    return found

    return True


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def _kill_group(pid: int) -> bool:
    """SIGKILL ``pid``'s process group (its children go with it); False if it was gone."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return False
    if pgid == os.getpgid(0):  # never our own group
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
        return True
    return False
