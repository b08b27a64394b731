"""A running pool's workdir (``prfaas up pool.yaml``): the files its processes read.

``pool.resolved.yaml`` is the pool file with real ports (0 in the file: a free one) and key files
as absolute paths; ``pool-internal.key`` the key the front door and its nodes sign their calls
with (made per run, never a tenant's); ``nodes-GROUP.yaml`` each group's node deployment file
(``pool.nodes_file``), or, for a group whose nodes run in processes of their own,
``nodes-GROUP+NODE.yaml`` per node (``+`` is in no name: no two files meet). All mode 0600. A
restarted process reads the same files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import yaml

from prfaas.config import load_yaml_mapping
from prfaas.errors import UsageError
from prfaas.pool_file import resolve_key
from prfaas.pool_sections import PoolFileConfig

POOL_NAME = "pool.resolved.yaml"
KEY_NAME = "pool-internal.key"


def nodes_name(group: str, node: str | None = None) -> str:
    """The node deployment file of ``group``'s shared process, or of ``node``'s own process."""
    return f"nodes-{group}.yaml" if node is None else f"nodes-{group}+{node}.yaml"


def write_private(path: Path, text: str) -> None:
    """Mode 0600, through a temporary file renamed over ``path``: a process reading it (a reload)
    sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def write_yaml(path: Path, data: object) -> None:
    write_private(path, yaml.safe_dump(data, sort_keys=False))


def load_resolved(workdir: Path) -> PoolFileConfig:
    return PoolFileConfig.model_validate(load_yaml_mapping(workdir / POOL_NAME, what="pool file"))


def internal_psk(workdir: Path) -> str:
    return (workdir / KEY_NAME).read_text().strip()


def tenant_keys(
    pool: PoolFileConfig, base_dir: Path, on_missing: Callable[[str], None] | None = None
) -> dict[str, tuple[str, bytes]]:
    """Key id -> (tenant, key) of every active tenant key (``pool_file.resolve_key``: an unset
    variable or unreadable file is a ``UsageError`` naming it; with ``on_missing`` that key is
    left out and its one-line reason handed there instead)."""
    out: dict[str, tuple[str, bytes]] = {}
    for i, t in enumerate(pool.tenants):
        for j, ref in enumerate(t.keys):
            try:
                out[ref.id] = (t.name, resolve_key(ref, base_dir, f"tenants.{i}.keys.{j}"))
            except UsageError as exc:
                if on_missing is None:
                    raise
                on_missing(f"{exc}: key {ref.id} of {t.name} is not accepted")
    if not out:
        raise UsageError("tenants: no tenant key resolves: the pool would refuse every call")
    return out
