"""``prfaas status FILE [--json]``: a running deployment at a glance, from the gateway's signed
control listener: every node (site, role, in rotation or why not, draining, KV in use, in flight,
refused KV handshakes), whether the gateway is ready, the control state (threshold, link states;
a pool tenant's tuner: its ``t`` and the inputs of its last re-choice), the elastic pool's last
autoscaler decision per group (action, reason, when), the last routes and, when FILE sits in a
``prfaas up`` workdir, the supervised processes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prfaas.commands.gateway_access import control_failure, load_with_ports
from prfaas.serve.process_group import pid_alive

NUM_ROUTES = 10


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "status",
        help="show a running deployment: nodes, rotation, routes, control state, processes",
        description=(
            "Ask the gateway of DEPLOYMENT.yaml (its control listener, signed with the file's "
            "psk) for every node, the last routes and the control state. For a deployment "
            "started by `prfaas up`, pass the resolved file it printed "
            "(WORKDIR/deployment.resolved.yaml): it names the real ports, and the supervised "
            "processes are shown too. Exit 1 when the gateway does not answer."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("deployment", type=Path, help="deployment YAML (the resolved file for up)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per call to the gateway")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from prfaas.errors import UsageError
    from prfaas.serve.control_client import ControlClient, ControlRefused, GatewayUnreachable

    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, got {args.timeout:g}")
    from prfaas.pool_file import is_pool_file

    if is_pool_file(args.deployment):  # a running pool's resolved file (docs/pool.md)
        from prfaas.commands.status_pool import run_pool_status

        return run_pool_status(args, _processes, _processes_table, table)
    d = load_with_ports(args.deployment)
    with ControlClient(d, timeout_s=args.timeout) as client:
        try:
            nodes = client.nodes()
            routes = client.routes()
            control = client.control()
            autoscale = client.autoscale()
            not_ready = client.ready()
        except (GatewayUnreachable, ControlRefused) as exc:
            return control_failure("status", args.deployment, exc)
    report = {
        "gateway": {
            "url": client.client_url,
            "control_url": client.url,
            "ready": not_ready is None,
            "not_ready_reason": not_ready,
        },
        "nodes": nodes,
        "control": control,
        "autoscale": autoscale,
        "num_routes": len(routes),
        "num_kv_recomputed": sum(1 for r in routes if r.get("kv_recomputed")),
        "routes": routes[-NUM_ROUTES:],
        "processes": _processes(args.deployment),
    }
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def _processes(path: Path) -> dict[str, Any] | None:
    """The supervisor's state file ``prfaas up`` keeps beside the resolved file, if any."""
    from prfaas.serve.processes_file import PROCESSES_NAME

    state = path.resolve().parent / PROCESSES_NAME
    try:
        doc: dict[str, Any] = json.loads(state.read_text())
    except (OSError, ValueError):
        return None
    doc["file"] = str(state)
    doc["launcher_alive"] = pid_alive(doc.get("launcher_pid"))
    return doc

    return True


# -- text ----------------------------------------------------------------------------------------
def render(report: dict[str, Any]) -> str:
    g = report["gateway"]
    ready = "ready" if g["ready"] else f"NOT READY: {g['not_ready_reason']}"
    out = [f"gateway {g['url']}  {ready}  (control {g['control_url']})", ""]
    out.append(_nodes(report["nodes"]))
    out += ["", _control(report["control"])]
    if report.get("autoscale"):
        out += ["", _autoscale(report["autoscale"])]
    recomputed = report.get("num_kv_recomputed", 0)
    unused = f"; {recomputed} decoded by recomputing, their KV unused" if recomputed else ""
    out += ["", f"routes (last {len(report['routes'])} of {report['num_routes']}{unused}):"]
    out.append(_routes(report["routes"]) if report["routes"] else "  none yet")
    procs = report["processes"]
    if procs is not None:
        out += ["", _processes_table(procs)]
    return "\n".join(out)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [headers, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def human_bytes(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1000 or unit == "TB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    raise AssertionError("unreachable")


def _nodes(nodes: list[dict[str, Any]]) -> str:
    rows = [
        [
            str(n["node"]),
            str(n["site"]),
            str(n["role"]),
            "in" if n.get("in_rotation") else f"out: {n.get('why_not') or 'unknown'}",
            "yes" if n.get("draining") else "no",
            human_bytes(float(n.get("kv_used_bytes", 0))),
            str(n.get("in_flight", 0)),
            str(n.get("handshake_failures", 0)),
        ]
        for n in nodes
    ]
    headers = ["NODE", "SITE", "ROLE", "ROTATION", "DRAINING", "KV IN USE", "IN FLIGHT"]
    return table([*headers, "REFUSED HANDSHAKES"], rows) if rows else "no node has registered"


def _control(c: dict[str, Any]) -> str:
    head = (
        f"control: threshold {c.get('threshold_tokens')} tokens; {c.get('ticks', 0)} ticks; "
        f"{len(c.get('threshold_updates', []))} threshold updates; "
        f"{len(c.get('role_changes', []))} role changes; "
        f"{c.get('window_rate_rps', 0.0):.2f} req/s over {c.get('window_requests', 0)} requests"
    )
    if c.get("pool_tuner"):
        head += "\n" + _pool_tuner(c["pool_tuner"])
    rows = [
        [
            str(lk["link"]),
            f"{human_bytes(lk['capacity_bytes_per_s'])}/s",
            f"{100 * lk['utilisation']:.0f}%",
            human_bytes(lk["backlog_bytes"]),
            f"{1000 * lk['rtt_s']:.1f} ms",
            f"{100 * lk['retransmit_rate']:.2f}%",
            "yes" if lk["congested"] else "no",
        ]
        for lk in c.get("links", [])
    ]
    if not rows:
        return head
    headers = ["LINK", "CAPACITY", "UTIL", "BACKLOG", "RTT", "RETRANSMITS", "CONGESTED"]
    return head + "\n" + table(headers, rows)


def _pool_tuner(p: dict[str, Any]) -> str:
    """A pool tenant's tuner (``pool.tuner``): its ``t`` and the inputs of its last choice."""
    head = (
        f"pool tuner {p['tuner']} (TTFT target {p['ttft_target_s']:g} s, every "
        f"{p['period_s']:g} s): t {p['threshold_tokens']} tokens; {p['num_choices']} re-choices"
    )
    if not p.get("choices"):
        return f"{head}; waiting: {p.get('waiting') or 'the first period'}"
    c = p["choices"][-1]
    return (
        f"{head}; last at {c['t_s']:.1f} s: t {c['threshold_tokens']} from share "
        f"{c['share']:.3f}, expected queueing {c['expected_queueing_s']:.2f} s, link backlog "
        f"{c['link_backlog_s']:.2f} s, {c['rate_rps']:.2f} req/s over {c['num_lengths']} "
        f"lengths, {c['num_local_prefill']} local prefill nodes ({c['local_backlog_s']:.2f} s "
        f"queued), {c['num_pool_nodes']} pool nodes"
    )


def _autoscale(groups: list[dict[str, Any]]) -> str:
    """The last decision per group, and its last add or drain."""
    import time

    def when(at_unix_s: float) -> str:
        return f"{max(0.0, time.time() - at_unix_s):.0f} s ago"

    rows = []
    for g in groups:
        change = g.get("last_change")
        last_change = (
            f"{change['action']} {change['num_nodes']} {when(change['at_unix_s'])}: "
            f"{change['reason']}"
            if change
            else "-"
        )
        rows.append([
            str(g["group"]),
            f"{g['num_serving']}+{g['num_starting']} starting",
            str(g.get("preempted", 0)),
            str(g["desired_nodes"]),
            f"{g['action']} ({g['code']}) {when(g['at_unix_s'])}: {g['reason']}",
            last_change,
        ])  # fmt: skip
    headers = ["GROUP", "NODES", "PREEMPTED", "DESIRED", "LAST DECISION", "LAST ADD/DRAIN"]
    return "autoscale:\n" + table(headers, rows)


def _routes(routes: list[dict[str, Any]]) -> str:
    rows = [
        [
            str(r.get("request_id", "")),
            str(r.get("num_prompt_tokens", "")),
            str(r.get("num_cached_tokens", "")),
            f"{r.get('prefill_site', '')}/{r.get('prefill_node', '')}",
            str(r.get("decode_node", "")),
            ("yes, KV unused: recomputed" if r.get("kv_recomputed") else "yes")
            if r.get("offloaded")
            else "no",
            str(r.get("attempts", "")),
        ]
        for r in routes
    ]
    headers = ["REQUEST", "PROMPT", "CACHED", "PREFILL", "DECODE", "OFFLOADED", "ATTEMPTS"]
    return table(headers, rows)


def _processes_table(doc: dict[str, Any]) -> str:
    head = f"processes ({doc['file']}, launcher pid {doc.get('launcher_pid')})"
    if doc.get("stopped"):
        head += ": stopped"
    elif not doc.get("launcher_alive"):
        head += ": the launcher is gone (as it last wrote them)"
    rows = [
        [
            str(p["name"]),
            str(p["state"]),
            str(p["pid"] if p["pid"] is not None else "-"),
            str(p["restarts"]),
            str(p["last_exit"] or "-"),
        ]
        for p in doc.get("processes", [])
    ]
    return head + "\n" + table(["PROCESS", "STATE", "PID", "RESTARTS", "LAST EXIT"], rows)
