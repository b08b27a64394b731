"""The launcher's resolved deployment file: what every child of ``prfaas up`` reads.

Real ports for the ones the file leaves at 0 (``resolve_ports``), written to the workdir readable
by this user only (``write_resolved``: it holds the key), and the file's nodes as an elastic pool
adds and removes them at run time (``with_node``, ``without_node``). Owns no process: the
launcher decides when to write. Imports config and the launcher's errors only.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import yaml

from prfaas.config import DeploymentConfig
from prfaas.serve.launch_errors import LaunchError

RESOLVED_NAME = "deployment.resolved.yaml"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def resolve_ports(d: DeploymentConfig) -> DeploymentConfig:
    """Real ports for the ones the file leaves at 0: what every child (and a restarted one) reads.
    A file without ``psk`` got a random key when it was loaded; the resolved file carries it, so
    this launcher's children share it."""
    gw = d.gateway
    update: dict[str, int] = {}
    if gw.port == 0:
        update["port"] = free_port(gw.host)
    if gw.control_port == 0:
        update["control_port"] = free_port(gw.host)
    if update:
        d = d.model_copy(update={"gateway": gw.model_copy(update=update)})
    return d


def write_resolved(path: Path, d: DeploymentConfig) -> None:
    # The file holds the key: readable by this user only.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(d.model_dump(mode="json")))
    os.chmod(path, 0o600)


def with_node(d: DeploymentConfig, site: str, name: str, role: str) -> DeploymentConfig:
    """``d`` with node ``name`` (its port left at 0) added to ``site``; a name taken or a site
    missing is a ``LaunchError``."""
    from prfaas.config import NodeConfig

    if any(n.name == name for s in d.sites for n in s.nodes):
        raise LaunchError(f"a node named {name!r} exists already")
    sites = [
        s.model_copy(update={"nodes": [*s.nodes, NodeConfig(name=name, role=role)]})
        if s.name == site
        else s
        for s in d.sites
    ]
    if sites == list(d.sites):
        raise LaunchError(f"no site named {site!r}")
    return d.model_copy(update={"sites": sites})


def without_node(d: DeploymentConfig, name: str) -> DeploymentConfig | None:
    """``d`` without node ``name``; None when it has no node of that name."""
    sites = [
        s.model_copy(update={"nodes": [n for n in s.nodes if n.name != name]}) for s in d.sites
    ]
    if sites != list(d.sites):
        return d.model_copy(update={"sites": sites})
    return None
