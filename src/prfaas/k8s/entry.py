"""What a prfaas pod runs: ``python -m prfaas.k8s.entry gateway|node|sidecar|drain|epp ...``, and
a pool's pods ``pool-front-door|pool-node ...`` (``pool_entry``: the workdir ``prfaas up
pool.yaml`` writes, then the same process command).

At start it composes the process's deployment file from the ConfigMap's variant and the mounted
Secret's key (``/run/prfaas/deployment.yaml``, a memory-backed volume, mode 0600), works out which
nodes this pod hosts (a StatefulSet pod: the group's ``POD_INDEX``-th node of the file; a
Deployment pod: a node named after the pod, added to its site), writes their names to
``/run/prfaas/nodes`` and execs ``prfaas serve`` (or ``prfaas epp``). ``drain`` (the preStop hook)
drains those nodes through the gateway's signed control listener, like ``prfaas drain``.

The directories come from ``names`` and can be moved with ``PRFAAS_K8S_ROOT`` (tests)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from prfaas.config import load_yaml_mapping
from prfaas.errors import UsageError
from prfaas.k8s import names as paths
from prfaas.k8s import pool_entry


def _root(path: str) -> Path:
    return Path(os.environ.get("PRFAAS_K8S_ROOT", "/") + path.lstrip("/"))


def compose(file_name: str) -> dict[str, Any]:
    """The ConfigMap's ``file_name`` with the key from the Secret."""
    raw = load_yaml_mapping(_root(paths.CONFIG_DIR) / file_name, what="rendered deployment file")
    key_path = _root(paths.SECRET_DIR) / "psk"
    try:
        key = key_path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UsageError(f"the deployment key {key_path}: {exc.strerror}") from None
    raw["psk"] = key
    # Keys still accepted during a rotation: in the same Secret, never in the ConfigMap.
    accepted = _root(paths.SECRET_DIR) / "accept_psks"
    if accepted.is_file():
        raw["accept_psks"] = accepted.read_text(encoding="utf-8").split()
    return raw


def pod_nodes(
    raw: dict[str, Any], site: str, role: str, group: str, env: dict[str, str]
) -> list[str]:
    """The nodes this pod hosts (``raw`` gains the pod's own node for a Deployment pod)."""
    entry = next((s for s in raw["sites"] if s["name"] == site), None)
    if entry is None:
        raise UsageError(f"--site: no site {site!r} in the rendered file")
    members = [n for n in entry["nodes"] if role == "node" or n["role"] == role]
    if role == "node":
        return [n["name"] for n in members]
    if group == "deployment":
        pod = env.get("POD_NAME", "")
        if not pod:
            raise UsageError("POD_NAME is not set: a Deployment pod's node is named after it")
        if not any(n["name"] == pod for n in entry["nodes"]):
            ports = paths.node_ports("pool" in raw)
            entry["nodes"].append({"name": pod, "role": role, **ports})
        return [pod]
    index_text = env.get("POD_INDEX", "")
    if not index_text.isdigit():
        raise UsageError(f"POD_INDEX {index_text!r} is not a pod index")
    index = int(index_text)
    if index >= len(members):
        raise UsageError(
            f"pod index {index}: site {site} has {len(members)} {role} node(s) in the file"
        )
    return [members[index]["name"]]


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def prepare(args: argparse.Namespace, env: dict[str, str]) -> tuple[Path, list[str]]:
    raw = compose(args.file)
    nodes: list[str] = []
    if args.command in ("node", "sidecar"):
        nodes = pod_nodes(raw, args.site, args.role, args.pod_group, env)
    if args.command == "sidecar":  # its own file: the node container writes the other one
        composed = _root(paths.SIDECAR_FILE)
        _write_private(composed, yaml.safe_dump(raw, sort_keys=True))
        return composed, nodes
    composed = _root(paths.COMPOSED_FILE)
    _write_private(composed, yaml.safe_dump(raw, sort_keys=True))
    _write_private(_root(paths.NODES_FILE), "".join(f"{n}\n" for n in nodes))
    return composed, nodes


def serve_argv(args: argparse.Namespace, composed: Path, nodes: list[str]) -> list[str]:
    if args.command == "gateway":
        return ["prfaas", "serve", "--role", "gateway", "--config", str(composed)]
    if args.command == "epp":
        return [
            "prfaas",
            "epp",
            "--config",
            str(composed),
            "--grpc-port",
            str(args.grpc_port),
            "--health-port",
            str(args.health_port),
        ]
    if args.command == "sidecar":  # the decode nodes of this pod (a "both" pod's decode ones)
        argv = ["prfaas", "epp-sidecar", "--config", str(composed), "--port", str(args.port)]
        raw = load_yaml_mapping(composed, what="composed deployment file")
        roles = {n["name"]: n["role"] for s in raw["sites"] for n in s["nodes"]}
        for n in nodes:
            if roles.get(n) == "decode":
                argv += ["--node", n]
        return argv
    argv = ["prfaas", "serve", "--role", args.role, "--config", str(composed), "--host", args.host]
    for n in nodes:
        argv += ["--node", n]
    return argv


def drain(timeout_s: int) -> int:
    """Drain every node of this pod at once; 0 when all are idle in time."""
    composed = _root(paths.COMPOSED_FILE)
    listed = _root(paths.NODES_FILE)
    nodes = listed.read_text(encoding="utf-8").split() if listed.is_file() else []
    procs = [
        subprocess.Popen(
            ["prfaas", "drain", str(composed), n, "--timeout", str(timeout_s)],
            stdin=subprocess.DEVNULL,
        )
        for n in nodes
    ]
    return max((p.wait() for p in procs), default=0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m prfaas.k8s.entry")
    sub = p.add_subparsers(dest="command", required=True)
    gw = sub.add_parser("gateway")
    gw.add_argument("--file", required=True)
    node = sub.add_parser("node")
    node.add_argument("--file", required=True)
    node.add_argument("--site", required=True)
    node.add_argument("--role", required=True, choices=("prefill", "decode", "node"))
    node.add_argument("--pod-group", required=True, choices=("statefulset", "deployment"))
    node.add_argument("--host", required=True)
    side = sub.add_parser("sidecar")
    side.add_argument("--file", required=True)
    side.add_argument("--site", required=True)
    side.add_argument("--role", required=True, choices=("decode", "node"))
    side.add_argument("--pod-group", required=True, choices=("statefulset", "deployment"))
    side.add_argument("--port", type=int, required=True)
    epp = sub.add_parser("epp")
    epp.add_argument("--file", required=True)
    epp.add_argument("--grpc-port", type=int, required=True)
    epp.add_argument("--health-port", type=int, required=True)
    dr = sub.add_parser("drain")
    dr.add_argument("--timeout", type=int, required=True)
    door = sub.add_parser("pool-front-door")
    door.add_argument("--file", required=True)
    pool_node = sub.add_parser("pool-node")
    pool_node.add_argument("--file", required=True)
    pool_node.add_argument("--group", required=True)
    pool_node.add_argument("--front-door", required=True, help="the control Service's host")
    pool_node.add_argument("--host", required=True)
    return p


def pool_argv(args: argparse.Namespace, env: dict[str, str]) -> list[str]:
    """A pool pod: compose its workdir, return the process it execs."""
    root = Path(os.environ.get("PRFAAS_K8S_ROOT", "/"))
    if args.command == "pool-front-door":
        return pool_entry.front_door(root, args.file)
    return pool_entry.node(root, args.file, args.group, args.front_door, args.host, env)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "drain":
            return drain(args.timeout)
        if args.command.startswith("pool-"):
            argv_serve = pool_argv(args, dict(os.environ))
        else:
            composed, nodes = prepare(args, dict(os.environ))
            argv_serve = serve_argv(args, composed, nodes)
    except UsageError as exc:
        print(f"prfaas k8s entry: error: {exc}", file=sys.stderr)
        return 2
    os.execvp(argv_serve[0], argv_serve)
    return 0  # not reached: exec replaced the process


if __name__ == "__main__":
    sys.exit(main())
