"""Which renderer a file takes: a pool file (``groups:`` and ``tenants:``, ``pool_render``), a
pool's tenant file (a deployment file with ``pool:``) or a deployment file (``render``); each
read and checked as ``prfaas up`` reads it, bad input one line naming the field."""

from __future__ import annotations

from pathlib import Path

from prfaas.config import load_deployment, load_yaml_mapping
from prfaas.errors import UsageError
from prfaas.k8s.options import RenderOptions
from prfaas.k8s.render import Rendering, render_deployment
from prfaas.k8s.secrets import require_key_source


def render_file(
    path: Path,
    opts: RenderOptions,
    inference_pool: bool = False,
    gateway_name: str = "inference-gateway",
) -> Rendering:
    from prfaas.pool_file import is_pool_file, load_pool

    if is_pool_file(path):
        from prfaas.k8s.pool_render import render_pool

        pool = load_pool(path)
        if inference_pool:
            raise UsageError("--inference-pool: a pool file has no gateway to pick for")
        _check_topology(path, opts, [g.name for g in pool.groups], "group")
        return render_pool(pool, path, opts)
    raw = load_yaml_mapping(path, what="deployment file")
    tenant = "pool" in raw  # its psk is its own pods' only: the Secret is named, not required
    if not tenant:
        require_key_source(raw, path)
    d = load_deployment(path, require_psk=not tenant)
    _check_topology(path, opts, [s.name for s in d.sites], "site")
    return render_deployment(d, opts, inference_pool, gateway_name)


def _check_topology(path: Path, opts: RenderOptions, known: list[str], what: str) -> None:
    unknown = sorted(set(opts.topology) - set(known))
    if unknown:
        raise UsageError(f"--site-topology: {path} has no {what} {unknown[0]!r}")
