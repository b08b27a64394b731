"""``sweep_dead_run``: a ``prfaas up`` killed outright leaves its children running in sessions of
their own; the next run in the same workdir stops them first, from the workdir's
``processes.json`` and resolved file. Stand-ins: sleeping processes whose command line names the
resolved file (members) or whose environment carries a sidecar's vLLM owner tag (servers); a
listed pid that is some other process, and another deployment's server, are left alone; a live
old launcher, or a run that stopped cleanly, means nothing is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from prfaas.config import DeploymentConfig
from prfaas.serve.leftovers import sweep_dead_run
from prfaas.serve.processes_file import PROCESSES_NAME
from prfaas.serve.vllm.server import OWNER_ENV, PRIVATE_FOLDER_PREFIX, RPC_DIR_ENV, owner_tag

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
SLEEP = "import time; time.sleep(120)"


def _deployment() -> DeploymentConfig:
    return DeploymentConfig.model_validate({
        "engine": {"kind": "vllm", "model": "tiny", "model_path": "/nonexistent"},
        "gateway": {"port": 8000, "control_port": 8001},
        "sites": [
            {"name": "pf", "kind": "prfaas", "hardware": "h200",
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": "h20",
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]},
        ],
        "links": [{"src": "pf", "dst": "pd", "gbps": 10}],
        "psk": "leftover-test-key-0123456789",
    })  # fmt: skip


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def _start(
    procs: list[subprocess.Popen[bytes]], *args: str, env: dict[str, str] | None = None
) -> int:
    p = subprocess.Popen([sys.executable, "-c", SLEEP, *args], start_new_session=True,
                         env={**os.environ, **(env or {})})  # fmt: skip
    procs.append(p)
    return p.pid


def _gone(p: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 10
    while p.poll() is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _workdir(
    tmp_path: Path, launcher_pid: int, members: dict[str, int], stopped: bool = False
) -> Path:
    d = _deployment()
    config = tmp_path / "deployment.resolved.yaml"
    config.write_text(yaml.safe_dump(d.model_dump(mode="json")))
    doc = {"launcher_pid": launcher_pid, "stopped": stopped,
           "processes": [{"name": n, "pid": pid} for n, pid in members.items()]}  # fmt: skip
    (tmp_path / PROCESSES_NAME).write_text(json.dumps(doc))
    return config


def test_a_dead_runs_members_and_vllm_servers_are_stopped(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    config = tmp_path / "deployment.resolved.yaml"
    d = _deployment()
    gateway = _start(procs, "serve", "--config", str(config))
    sidecar = _start(procs, "serve", "--config", str(config))
    stranger = _start(procs, "serve", "--config", str(tmp_path / "other.yaml"))  # pid reused
    # the dead sidecar's private folder, named in its server's environment: removed with it
    folder = Path(tempfile.mkdtemp(prefix=PRIVATE_FOLDER_PREFIX))
    mine = {OWNER_ENV: owner_tag("p0+d0", d.psk, d.control_url), RPC_DIR_ENV: str(folder)}
    server = _start(procs, env=mine)
    theirs = {OWNER_ENV: owner_tag("p0+d0", d.psk, "http://127.0.0.1:9999")}
    other_server = _start(procs, env=theirs)  # another deployment's, same names and key
    members = {"gateway": gateway, "pd": sidecar, "pf0": stranger}
    _workdir(tmp_path, _dead_pid(), members)
    stopped = sweep_dead_run(tmp_path, config)
    assert sorted(stopped) == sorted([f"gateway (pid {gateway})", f"pd (pid {sidecar})",
                                      f"pd's vLLM server (pid {server})"])  # fmt: skip
    by_pid = {p.pid: p for p in procs}
    for pid in (gateway, sidecar, server):
        assert _gone(by_pid[pid]), pid
    assert by_pid[stranger].poll() is None and by_pid[other_server].poll() is None
    assert not folder.exists()
    assert sweep_dead_run(tmp_path, config) == []  # nothing left


@pytest.mark.parametrize("case", ["launcher alive", "stopped cleanly", "no file"])
def test_nothing_is_touched_unless_the_old_run_died(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], case: str
) -> None:
    config = tmp_path / "deployment.resolved.yaml"
    gateway = _start(procs, "serve", "--config", str(config))
    launcher = _start(procs) if case == "launcher alive" else _dead_pid()
    _workdir(tmp_path, launcher, {"gateway": gateway}, stopped=case == "stopped cleanly")
    if case == "no file":
        (tmp_path / PROCESSES_NAME).unlink()
    assert sweep_dead_run(tmp_path, config) == []
    assert procs[0].poll() is None
