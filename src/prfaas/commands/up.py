"""``prfaas up``: start a whole deployment on this machine; Ctrl-C stops it, leaving nothing."""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "up",
        help="run a whole deployment (gateway, sites, nodes) on this machine",
        description=(
            "Start the gateway and every node of DEPLOYMENT.yaml as separate processes on this "
            "machine, wait until all nodes have registered, print the endpoint, and run until "
            "Ctrl-C (or SIGTERM), then stop every process. See README for the file format."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("deployment", type=Path, help="deployment YAML")
    p.add_argument("--workdir", type=Path, default=None, help="logs and resolved config")
    p.add_argument("--process-per-node", action="store_true", help="one process per node")
    p.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to come up")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from prfaas.config import load_deployment
    from prfaas.serve.launcher import Launcher, LaunchError

    d = load_deployment(args.deployment)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="prfaas-up-"))
    try:
        launcher = Launcher(d, workdir, args.process_per_node)
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    try:
        launcher.start(args.ready_timeout)
    except LaunchError as exc:
        raise UsageError(f"deployment did not come up: {exc}") from None
    try:
        print(f"prfaas: {len(launcher.nodes())} nodes up; OpenAI endpoint {launcher.url}/v1")
        print(f"prfaas: logs in {workdir}; Ctrl-C stops everything")
        while not stop:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        launcher.stop()
        print("prfaas: stopped")
    return 0
