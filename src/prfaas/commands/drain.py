"""``prfaas drain FILE NODE [--timeout S]``: take a node out of rotation, let its work finish and
report when it is idle; ``prfaas drain --resume FILE NODE`` puts it back. Through the gateway's
signed control listener, like ``prfaas status``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from prfaas.commands.gateway_access import control_failure, load_with_ports

POLL_PERIOD_S = 0.2


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "drain",
        help="take a node out of rotation and wait until it is idle (--resume: put it back)",
        description=(
            "Tell the gateway of DEPLOYMENT.yaml to send NODE no new work, then wait until the "
            "requests it holds have finished (exit 0) or --timeout passes (exit 1; the node "
            "stays out of rotation). With --resume, put NODE back into rotation. For a "
            "deployment started by `prfaas up`, pass WORKDIR/deployment.resolved.yaml."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("deployment", type=Path, help="deployment YAML (the resolved file for up)")
    p.add_argument("node", help="node name, as in the deployment file")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for idle")
    p.add_argument("--resume", action="store_true", help="put the node back into rotation")
    p.set_defaults(run=run)


def _say(message: str) -> None:
    print(f"prfaas: {message}", flush=True)


def run(args: argparse.Namespace) -> int:
    from prfaas.errors import UsageError
    from prfaas.serve.control_client import ControlClient, ControlRefused, GatewayUnreachable

    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, got {args.timeout:g}")
    d = load_with_ports(args.deployment)
    d.site_of(args.node)  # a name the file does not have: UsageError naming it
    with ControlClient(d) as client:
        try:
            if args.resume:
                row = client.resume(args.node)
                where = "in rotation" if row.get("in_rotation") else f"out: {row.get('why_not')}"
                _say(f"{args.node} resumed ({where})")
                return 0
            return _drain(client, args.node, args.timeout)
        except (GatewayUnreachable, ControlRefused) as exc:
            return control_failure("drain", args.deployment, exc)


def _drain(client: Any, node: str, timeout_s: float) -> int:
    row: dict[str, Any] = client.drain(node)
    _say(f"{node} is out of rotation; waiting for its requests to finish")
    deadline = time.monotonic() + timeout_s
    last: int | None = None
    while True:
        in_flight = int(row.get("in_flight", 0))
        if in_flight == 0:
            _say(f"{node} is idle (0 in flight) and out of rotation")
            return 0
        if in_flight != last:
            _say(f"{node}: {in_flight} in flight")
            last = in_flight
        if time.monotonic() >= deadline:
            print(
                f"prfaas drain: {node} still has {in_flight} in flight after {timeout_s:g} s; "
                f"it stays out of rotation (`prfaas drain --resume` puts it back)",
                file=sys.stderr,
            )
            return 1
        time.sleep(POLL_PERIOD_S)
        found = [n for n in client.nodes() if n["node"] == node]
        if not found:
            print(f"prfaas drain: {node} left the gateway's registry while draining",
                  file=sys.stderr)  # fmt: skip
            return 1
        row = found[0]
