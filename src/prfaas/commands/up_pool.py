"""``prfaas up pool.yaml``: start a PrfaaS pool (its front door and node processes) and keep it
running until Ctrl-C or SIGTERM, leaving nothing; SIGHUP (or ``prfaas reload``) applies the pool
file's tenants again (``docs/pool.md``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from prfaas.config import DeploymentConfig
from prfaas.errors import UsageError

if TYPE_CHECKING:
    from prfaas.pool.launcher import PoolLauncher


def _say(message: str) -> None:
    print(f"prfaas: {message}", flush=True)


def _warn(message: str) -> None:
    print(f"prfaas: warning: {message}", file=sys.stderr, flush=True)


def run_pool(args: argparse.Namespace) -> int:
    from prfaas.commands.launch_checks import check_model_folder
    from prfaas.pool.launcher import PoolLauncher
    from prfaas.pool.reload_result import write_reload_result
    from prfaas.pool.resolved import KEY_NAME, POOL_NAME, tenant_keys
    from prfaas.pool_file import load_pool, plaintext_warnings
    from prfaas.serve.launch_errors import LaunchCancelled, LaunchError
    from prfaas.serve.supervisor import RestartPolicy

    pool = load_pool(args.deployment)
    for i, group in enumerate(pool.groups):
        if group.kind != "timed" and group.model_path is not None:
            check_model_folder(group.model_path, f"groups.{i}.model_path")
    in_clear = plaintext_warnings(pool)
    if in_clear and not pool.front_door.allow_plaintext:
        # TLS by default: tenants may be other organisations across a WAN.
        raise UsageError(
            f"{in_clear[0]}; set it, or front_door.allow_plaintext: true on a trusted network"
            + (f" ({len(in_clear) - 1} more in the clear)" if len(in_clear) > 1 else "")
        )
    for why in in_clear:
        _warn(why)
    # Each key that does not resolve is named before any start (and left out of the pool).
    tenant_keys(pool, args.deployment.resolve().parent, on_missing=_warn)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="prfaas-pool-"))
    policy = None if args.no_restart else RestartPolicy(max_deaths=args.max_deaths)
    launcher = PoolLauncher(pool, args.deployment, workdir, restart=policy)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("prfaas: %(message)s"))
    logging.getLogger("prfaas.launcher").addHandler(handler)
    logging.getLogger("prfaas.launcher").setLevel(logging.WARNING)
    stop = threading.Event()
    reload_wanted = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        launcher.cancel()  # a flag: start() notices it at its next poll
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    # SIGHUP reloads the tenants (keys, weights, caps) from the pool file, as daemons do; one
    # that comes during start-up is applied once the pool is up.
    signal.signal(signal.SIGHUP, lambda _s, _f: reload_wanted.set())
    try:
        _say(f"starting pool {args.deployment} (logs in {workdir})")
        try:
            launcher.start(args.ready_timeout)
        except LaunchCancelled:
            return 0
        except LaunchError as exc:
            print(f"prfaas up: error: pool did not come up: {exc}", file=sys.stderr)
            return 1
        nodes = sum(len(g.node_names) for g in launcher.pool.groups)
        _say(f"ready: {nodes} pool nodes in {len(launcher.pool.groups)} groups")
        _say(f"tenant API (signed, v1) {launcher.url}/v1")
        _say(f"pool listener {launcher.control_url} (signed with {workdir / KEY_NAME})")
        _say(f"resolved pool file {workdir / POOL_NAME} (for `prfaas status`)")
        while not stop.wait(0.2):
            if reload_wanted.is_set():
                reload_wanted.clear()
                write_reload_result(workdir, *_reload(launcher))
    finally:
        launcher.stop()
        _say("stopped")
    return 0


def _reload(launcher: PoolLauncher) -> tuple[bool, str, bool]:
    """(applied, what it says, whether the file was bad) of one reload of the file's tenants."""
    from prfaas.serve.launch_errors import LaunchError

    try:
        said = launcher.reload()
    except (UsageError, LaunchError) as exc:
        _warn(f"tenants not reloaded: {exc}")
        return False, str(exc), isinstance(exc, UsageError)
    _say(f"tenants reloaded: {said}")
    return True, said, False


def check_tenant_pool(d: DeploymentConfig) -> str:
    """A tenant file's pool at start: its key must resolve (a ``UsageError`` naming the field);
    an unreachable pool is said, and local serving goes on (the gateway keeps trying)."""
    import httpx

    from prfaas.pool.client import pool_verify
    from prfaas.pool_file import resolve_key, tenant_in_clear

    assert d.pool is not None
    resolve_key(d.pool.key, Path.cwd(), "pool.key")
    url = d.pool.url.rstrip("/")
    in_clear = tenant_in_clear(d.pool)
    if in_clear is not None:  # TLS by default: the prompts go to the pool, maybe another org's
        raise UsageError(in_clear)
    named = {} if d.pool.server_hostname is None else {"sni_hostname": d.pool.server_hostname}
    try:
        with httpx.Client(timeout=2.0, trust_env=False, verify=pool_verify(d.pool.ca)) as c:
            c.get(f"{url}/health", extensions=named).raise_for_status()
    except httpx.HTTPError as exc:
        why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        return (f"pool: {url} is not reachable ({why}): every prefill is local until it "
                "answers")  # fmt: skip
    return f"pool: {url} answers; tenant {d.pool.tenant} offloads there"
