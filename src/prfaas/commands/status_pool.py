"""``prfaas status WORKDIR/pool.resolved.yaml``: a running pool at a glance (``docs/pool.md``): the
front door's epoch and live nodes, every pool node (group, process, live or draining, what it
runs) and each tenant's counters (handed-back prefills among them) from the pool's own listener
(signed with the workdir's internal key, never a tenant's), and the supervised processes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


def run_pool_status(
    args: argparse.Namespace,
    processes: Callable[[Path], dict[str, Any] | None],
    processes_table: Callable[[dict[str, Any]], str],
    table: Callable[[list[str], list[list[str]]], str],
) -> int:
    """``processes``, ``processes_table``, ``table``: ``commands.status``'s (handed in: that
    module calls this one)."""
    from prfaas.pool.resolved import KEY_NAME
    from prfaas.pool_file import load_pool
    from prfaas.serve.auth import SignedAuth
    from prfaas.serve.keyring import ring_of_psks

    pool = load_pool(args.deployment)
    door = pool.front_door
    url = f"{door.scheme}://{door.host}:{door.port}"
    control_url = f"http://{door.host}:{door.control_port}"
    key_file = args.deployment.resolve().parent / KEY_NAME
    try:
        auth = SignedAuth(ring_of_psks(key_file.read_text().strip()))
    except OSError as exc:
        print(f"prfaas status: error: {key_file}: {exc.strerror} (pass the resolved pool file "
              "`prfaas up` printed)", file=sys.stderr)  # fmt: skip
        return 1
    try:
        with httpx.Client(timeout=args.timeout, trust_env=False) as client:
            health = client.get(f"{control_url}/health").json()
            nodes = client.get(f"{control_url}/internal/nodes", auth=auth).json()
            tenants = client.get(f"{control_url}/internal/tenants", auth=auth).json()
    except (httpx.HTTPError, ValueError) as exc:
        print(f"prfaas status: error: the pool at {url} does not answer: {exc}", file=sys.stderr)
        return 1
    report: dict[str, Any] = {
        "front_door": {"url": url, "control_url": control_url, **health},
        "nodes": nodes,
        "tenants": tenants.get("tenants", {}),
        "processes": processes(args.deployment),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    fd = report["front_door"]
    out = [f"pool front door {url}  epoch {fd.get('epoch')}  {fd.get('nodes_live')} nodes live "
           f"(pool listener {control_url})", ""]  # fmt: skip
    rows = [[n["node"], n["group"], n.get("process", "-"),
             ("yes" if n["live"] else f"no {n['fault']}".strip())
             + (", draining" if n.get("draining") else ""),
             n["running"] or "-"] for n in nodes]  # fmt: skip
    heads = ["NODE", "GROUP", "PROCESS", "LIVE", "RUNNING"]
    out.append(table(heads, rows) if rows else "no pool node")
    cols = ["accepted", "placed", "done", "failed", "aborted", "handed_back", "queued_tokens",
            "running"]  # fmt: skip
    trows = [[name, "revoked" if row.get("revoked") else ",".join(row.get("keys", [])) or "-",
              *(str(row.get(c, "")) for c in cols)]
             for name, row in report["tenants"].items()]  # fmt: skip
    out += ["", table(["TENANT", "KEYS", *(c.upper() for c in cols)], trows)]
    if report["processes"] is not None:
        out += ["", processes_table(report["processes"])]
    print("\n".join(out))
    return 0
