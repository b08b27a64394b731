"""``prfaas reload WORKDIR/pool.resolved.yaml``: apply a running pool's file again (its tenants:
keys, weights, caps), as SIGHUP to its ``prfaas up`` does, and say what the pool now accepts."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "reload",
        help="apply a running pool's tenants (keys, weights, caps) again from its pool file",
        description=(
            "Tell the `prfaas up pool.yaml` that runs the pool whose resolved file is POOL "
            "(WORKDIR/pool.resolved.yaml, as for `prfaas status`) to read its pool file again "
            "and apply the tenants: a key added is accepted, a key removed is refused from the "
            "next call on and its open KV links closed, a tenant left without a key is revoked "
            "(its queued prefills dropped, running ones aborted with the reason `revoked`). "
            "Same as `kill -HUP` of that prfaas up. Exit 0 applied, 2 when the pool file does "
            "not load (nothing changed), 1 when no pool runs there or it did not answer."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("pool", type=Path, help="a running pool's WORKDIR/pool.resolved.yaml")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the pool")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json

    from prfaas.errors import UsageError
    from prfaas.pool.reload_result import read_reload_result
    from prfaas.pool_file import is_pool_file
    from prfaas.serve.process_group import pid_alive
    from prfaas.serve.processes_file import PROCESSES_NAME

    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, got {args.timeout:g}")
    if not args.pool.is_file():
        raise UsageError(f"{args.pool}: no such file")
    if not is_pool_file(args.pool):
        raise UsageError(
            f"{args.pool}: not a pool file (reload applies a running pool's tenants; a "
            "deployment's own key rotates with SIGHUP to each process, docs/live.md)"
        )
    workdir = args.pool.parent
    try:
        doc = json.loads((workdir / PROCESSES_NAME).read_text())
        pid = int(doc["launcher_pid"])
        stopped = bool(doc.get("stopped"))
    except (OSError, ValueError, KeyError, TypeError):
        print(f"prfaas reload: no pool runs in {workdir} (no {PROCESSES_NAME})", file=sys.stderr)
        return 1
    if stopped or not pid_alive(pid):
        print(f"prfaas reload: the pool in {workdir} is not running (launcher pid {pid})",
              file=sys.stderr)  # fmt: skip
        return 1
    last = read_reload_result(workdir)
    seq = last.seq if last is not None else 0
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + args.timeout
    while (result := read_reload_result(workdir)) is None or result.seq <= seq:
        if time.monotonic() > deadline:
            print(f"prfaas reload: the pool did not answer within {args.timeout:g} s "
                  f"(see {workdir}/frontdoor.log)", file=sys.stderr)  # fmt: skip
            return 1
        time.sleep(0.1)
    if result.applied:
        print(f"prfaas: tenants reloaded: {result.message}")
        return 0
    print(f"prfaas reload: error: {result.message}", file=sys.stderr)
    return 2 if result.bad_file else 1
