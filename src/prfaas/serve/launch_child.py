"""One child process of ``prfaas up``: its command line and how it starts.

A child is ``prfaas serve --config RESOLVED`` with its role's arguments, run inside its site's
namespace for a ``netns: true`` deployment (``serve.launch_netns``) or listening on the gateway's
address when that names one (``node_host``); it starts in a session of its own (so its whole
process group can be stopped) with stdout and stderr through a pipe into its rotated log
(``serve.childlog``); ``spawn`` is also how the pool launcher (``pool.launcher``) starts its
children. Owns no bookkeeping: which children run, and restarts, are the launcher's
and ``serve.supervisor``'s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.serve.childlog import LogPump, RotatingLog
from prfaas.serve.keyring import LAUNCHED_BY_UP_ENV
from prfaas.serve.launch_netns import namespaced_argv
from prfaas.serve.process_group import ChildGroup


@dataclass
class Child:
    """One supervised member as it is now: its current process (a restart replaces it)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: RotatingLog

    @property
    def log_path(self) -> Path:
        return self.log.path

    def log_tail(self, lines: int = 15) -> str:
        return self.log.tail(lines)


def node_host(gateway_host: str) -> str | None:
    """Where ``prfaas up``'s nodes listen when not the default 127.0.0.1: the gateway's address
    when it names one (a PD site whose KV receivers a pool on another machine must reach). A
    wildcard (0.0.0.0, ::) is where to listen, not an address to advertise: the nodes stay on
    loopback."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(gateway_host)
    except ValueError:
        return None  # a name (localhost, a host name): the default
    return None if ip.is_loopback or ip.is_unspecified else gateway_host


def serve_command(
    config_path: Path, d: DeploymentConfig, testbed: Any, name: str, args: list[str]
) -> tuple[list[str], list[str]]:
    """(command, arguments) of member ``name``: the same arguments, the resolved file."""
    cmd = [sys.executable, "-m", "prfaas.cli", "serve", "--config", str(config_path)]
    if testbed is not None and name != "gateway":
        cmd, args = namespaced_argv(testbed, d, cmd, args)
    elif name != "gateway" and (host := node_host(d.gateway.host)) is not None:
        args = [*args, "--host", host]
    return cmd, args


UP_CHILD_ENV: Mapping[str, str] = MappingProxyType(
    {
        # Workers log warnings, not transformers' notes about missing GPU kernels.
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        LAUNCHED_BY_UP_ENV: "1",  # a placeholder key: `prfaas up` warned about it already
    }
)
"""What ``prfaas up`` adds to its children's environment (``spawn``'s ``extra_env``). The pool
launcher (``pool.launcher``) adds none of it: its children are not ``prfaas serve`` (the only
reader of ``LAUNCHED_BY_UP_ENV``) and their key is a fresh random one, never a placeholder."""


def spawn(
    argv: list[str], log: RotatingLog, name: str, *, extra_env: Mapping[str, str]
) -> tuple[ChildGroup, LogPump]:
    """Start ``argv`` in a session of its own (so its whole process group can be stopped), its
    stdout and stderr through a pipe pumped into ``log``; its environment is this process's,
    unbuffered, plus ``extra_env``. The one place ``prfaas up`` and the pool launcher start a
    child."""
    # Unbuffered, so a crash's last lines reach the log before the process is gone.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra_env}
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            argv,
            stdout=write_fd,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        # The child holds its own copy; ours closed, the pump sees EOF when the child exits.
        os.close(write_fd)
    return ChildGroup(proc), LogPump(read_fd, log, name)
