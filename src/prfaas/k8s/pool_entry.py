"""What a pool's pod composes before it starts (``python -m prfaas.k8s.entry pool-front-door |
pool-node``): the workdir ``prfaas up pool.yaml`` would have written (``pool.resolved``), from the
ConfigMap's ``pool.yaml`` and the mounted Secrets, in the memory-backed run directory (mode
0600), and the process command ``PoolLauncher`` runs (``pool.launcher``'s builders).

- Front door: ``pool.resolved.yaml`` (the ConfigMap's file: all addresses, fixed ports, tenant
  keys as the mounted Secret files) and ``pool-internal.key`` (the ``NAME-psk`` Secret).
- Node: the same, with ``front_door.host`` the front door's control Service (where the nodes
  register), and ``nodes-GROUP.yaml`` (``pool.nodes_file``) holding only this pod's node: the
  group's ``POD_INDEX``-th as the file lists it, at the fixed pod ports; the process binds and
  advertises the pod's own address (``--host``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from prfaas.config import DeploymentConfig, load_yaml_mapping
from prfaas.errors import UsageError
from prfaas.k8s import names as paths
from prfaas.pool.nodes_file import one_node_deployment
from prfaas.pool.resolved import KEY_NAME, POOL_NAME, nodes_name, write_private, write_yaml
from prfaas.pool_sections import PoolFileConfig


def _pool(root: Path, file_name: str, front_door_host: str | None) -> PoolFileConfig:
    raw: dict[str, Any] = load_yaml_mapping(
        root / paths.CONFIG_DIR.lstrip("/") / file_name, what="rendered pool file"
    )
    if front_door_host is not None:
        raw.setdefault("front_door", {})["host"] = front_door_host
    try:
        return PoolFileConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise UsageError(f"rendered pool file: {where}: {first['msg']}") from None


def _internal_key(root: Path) -> str:
    key_path = root / paths.SECRET_DIR.lstrip("/") / "psk"
    try:
        return key_path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UsageError(f"the pool's internal key {key_path}: {exc.strerror}") from None


def _workdir(root: Path, pool: PoolFileConfig, key: str) -> Path:
    workdir = root / paths.POOL_WORKDIR.lstrip("/")
    workdir.mkdir(parents=True, exist_ok=True)
    write_yaml(workdir / POOL_NAME, pool.model_dump(mode="json"))
    write_private(workdir / KEY_NAME, key + "\n")
    return workdir


def front_door(root: Path, file_name: str) -> list[str]:
    """Compose the front door's workdir; its process's argv."""
    from prfaas.pool.launcher import front_door_args

    workdir = _workdir(root, _pool(root, file_name, None), _internal_key(root))
    return [sys.executable, *front_door_args(workdir)]


def pod_node(pool: PoolFileConfig, group: str, env: dict[str, str]) -> str:
    """The node this pod of ``group``'s StatefulSet hosts."""
    g = next((g for g in pool.groups if g.name == group), None)
    if g is None:
        raise UsageError(f"--group: no group {group!r} in the rendered pool file")
    index_text = env.get("POD_INDEX", "")
    if not index_text.isdigit():
        raise UsageError(f"POD_INDEX {index_text!r} is not a pod index")
    index = int(index_text)
    if index >= len(g.node_names):
        raise UsageError(f"pod index {index}: group {group} has {len(g.node_names)} node(s)")
    return g.node_names[index]


def node_file(pool: PoolFileConfig, group: str, node: str, key: str) -> DeploymentConfig:
    """The group's node deployment file, hosting ``node`` only, at the fixed pod ports."""
    g = next(g for g in pool.groups if g.name == group)
    return one_node_deployment(
        pool, g, node, key, port=paths.NODE_HTTP_PORT, transfer_port=paths.NODE_KV_PORT
    )


def node(
    root: Path, file_name: str, group: str, front_door_host: str, host: str, env: dict[str, str]
) -> list[str]:
    """Compose a node pod's workdir; its process's argv."""
    from prfaas.pool.launcher import node_group_args

    pool = _pool(root, file_name, front_door_host)
    name = pod_node(pool, group, env)
    key = _internal_key(root)
    workdir = _workdir(root, pool, key)
    d = node_file(pool, group, name, key)
    write_yaml(workdir / nodes_name(group), d.model_dump(mode="json"))
    return [sys.executable, *node_group_args(workdir, group, host)]
