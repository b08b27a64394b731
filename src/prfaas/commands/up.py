"""``prfaas up``: start a whole deployment on this machine and keep it running (supervised: a dead
process is restarted with backoff, one that keeps dying is reported and left down); Ctrl-C or
SIGTERM stops it, leaving nothing."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from prfaas.commands.common import check_api_key_env
from prfaas.commands.launch_checks import check_cores_here, check_model_folders
from prfaas.errors import UsageError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "up",
        help="run a whole deployment (gateway, sites, nodes) on this machine, supervised",
        description=(
            "Start the gateway and every node of DEPLOYMENT.yaml as separate processes on this "
            "machine, wait until the gateway's /ready says it can serve, print the endpoints and "
            "the resolved deployment file (real ports; `prfaas status` and `prfaas drain` take "
            "it), and keep every process running until Ctrl-C (or SIGTERM): a process that dies "
            "is started again after a backoff (0.5 s doubling to 10 s); one that dies "
            "--max-deaths times within 60 s is reported and left down. Logs: one per process "
            "in the workdir, rotated at 10 MB, 3 kept. See README for the file format."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("deployment", type=Path, help="deployment YAML")
    p.add_argument("--workdir", type=Path, default=None, help="logs and resolved config")
    p.add_argument("--process-per-node", action="store_true", help="one process per node")
    p.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to come up")
    p.add_argument(
        "--max-deaths", type=int, default=5, help="deaths within 60 s before a process is left down"
    )
    p.add_argument("--no-restart", action="store_true", help="report deaths, restart nothing")
    p.set_defaults(run=run)


def _say(message: str) -> None:
    print(f"prfaas: {message}", flush=True)


def run(args: argparse.Namespace) -> int:
    from prfaas.config import load_deployment
    from prfaas.serve.launcher import LaunchCancelled, Launcher, LaunchError, RestartPolicy
    from prfaas.serve.supervisor import Event, EventKind

    if args.ready_timeout <= 0:
        raise UsageError(f"--ready-timeout must be > 0, got {args.ready_timeout:g}")
    if args.max_deaths < 1:
        raise UsageError(f"--max-deaths must be >= 1, got {args.max_deaths}")
    from prfaas.pool_file import is_pool_file

    if is_pool_file(args.deployment):  # a PrfaaS pool: its front door and nodes (docs/pool.md)
        from prfaas.commands.up_pool import run_pool

        return run_pool(args)
    d = load_deployment(args.deployment)
    _warn_placeholder_key(args.deployment, d.psk, d.accept_psks)
    if d.pool is not None:  # a tenant of a PrfaaS pool (docs/pool.md)
        from prfaas.commands.up_pool import check_tenant_pool

        _say(check_tenant_pool(d))
    check_api_key_env()
    d.require_one_pd_site()
    check_cores_here(d)
    check_model_folders(d)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="prfaas-up-"))
    policy = None if args.no_restart else RestartPolicy(max_deaths=args.max_deaths)
    try:
        launcher = Launcher(d, workdir, args.process_per_node, restart=policy)
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("prfaas: %(message)s"))
    logging.getLogger("prfaas.launcher").addHandler(handler)
    logging.getLogger("prfaas.launcher").setLevel(logging.WARNING)

    stop = threading.Event()
    gateway_lost: list[str] = []

    def on_event(event: Event) -> None:
        if event.member == "gateway" and event.kind is EventKind.GAVE_UP:
            gateway_lost.append(event.detail)
            stop.set()  # nothing can serve without it: stop rather than run headless

    launcher.on_event = on_event

    def on_signal(_signum: int, _frame: object) -> None:
        # No exception from here: raised between a child's spawn and its bookkeeping it would
        # leave that child running. start() notices the flag at its next step instead.
        launcher.cancel()
        stop.set()

    # SIGINT too: a shell may start `up` in the background with SIGINT ignored.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    elastic: Any = None
    try:
        _say(f"starting {args.deployment} (logs in {workdir})")
        try:
            launcher.start(args.ready_timeout, progress=_say)
        except LaunchCancelled:
            return 0  # finally: stop() (start() already stopped what it began)
        except LaunchError as exc:
            print(f"prfaas up: error: deployment did not come up: {exc}", file=sys.stderr)
            return 1
        nodes = launcher.nodes()
        _say(f"ready: {len(nodes)} nodes in rotation ({', '.join(n['node'] for n in nodes)})")
        _say(f"OpenAI endpoint  {launcher.url}/v1")
        _say(f"control endpoint {launcher.control_url} (signed with the file's psk)")
        _say(f"resolved deployment {launcher.config_path} (for `prfaas status` / `prfaas drain`)")
        _say(f"logs in {workdir} (NAME.log, rotated); Ctrl-C stops everything")
        if d.autoscale is not None:  # the elastic pool's loop (docs/elastic.md)
            from prfaas.serve.elastic.loop import ElasticLoop

            elastic_log = logging.getLogger("prfaas.elastic")  # adds, drains, start-ups
            elastic_log.addHandler(handler)
            elastic_log.setLevel(logging.INFO)
            elastic = ElasticLoop(launcher)
            elastic.start()
            _say(f"autoscaling the PrfaaS pool every {d.autoscale.tick_s:g} s")
        while not stop.wait(0.5):
            pass
    finally:
        if elastic is not None:
            elastic.stop()
        launcher.stop()
        _say("stopped")
    if gateway_lost:
        print(f"prfaas up: error: the gateway kept dying ({gateway_lost[0]})", file=sys.stderr)
        return 1
    return 0


def _warn_placeholder_key(path: Path, psk: str, accept_psks: list[str]) -> None:
    from prfaas.serve.keyring import placeholder_in

    key = placeholder_in(psk, accept_psks)
    if key is not None:
        print(
            f"prfaas: warning: {path}: psk: {key!r} is the examples' public placeholder; fine on "
            "one machine, but `prfaas serve` refuses it: put a secret of your own before the "
            "processes listen anywhere others can reach",
            file=sys.stderr,
        )
