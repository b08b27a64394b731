"""What ``prfaas up`` and ``prfaas serve`` check of a deployment against this host before
anything starts: the cores the file pins processes to, and the model folders its torch and vLLM
sites (or a pool's groups) name. Not in ``config``: ``prfaas k8s``, ``sim`` and ``plan`` read
files written for other hosts. Imported by ``commands.up``, ``up_pool``, ``serve`` and
``profile_deployment``; imports no command module.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from prfaas.errors import UsageError

if TYPE_CHECKING:
    from prfaas.config import DeploymentConfig


def check_cores_here(d: DeploymentConfig) -> None:
    """Every core the file pins a process to (``gateway.cpus``, a site's ``engine.cpus`` or
    vLLM ``cpu_bind``) is one this host lets ``prfaas up`` use: refused before anything starts
    (a child would exit with the same error, after its siblings had started)."""
    have = os.sched_getaffinity(0)
    pinned = [("gateway.cpus", d.gateway_cores())]
    pinned += [(f"sites[{s.name}]'s cores", d.cores_of_site(s.name)) for s in d.sites]
    for field, cores in pinned:
        if cores is not None and not cores <= have:
            raise UsageError(
                f"{field}: cores {sorted(cores - have)} are not among this host's {sorted(have)}"
            )


def check_model_folders(d: DeploymentConfig, sites: Iterable[str] | None = None) -> None:
    """Every torch or vLLM site among ``sites`` (None: all) names a model folder that is here
    (``check_model_folder``). Checked at launch, not when the file is read: ``prfaas k8s`` and
    ``prfaas sim`` read files written for other hosts."""
    names = set(sites) if sites is not None else {s.name for s in d.sites}
    for site in d.sites:
        path = d.engine_for(site.name).model_path
        if site.name not in names or d.engine_for(site.name).kind == "timed" or path is None:
            continue
        own = site.engine is not None and site.engine.model_path is not None
        field = f"sites[{site.name}].engine.model_path" if own else "engine.model_path"
        check_model_folder(path, field)


def check_model_folder(path: str, field: str) -> None:
    """``path`` (the value of ``field``) is a Hugging Face model folder here, or a ``UsageError``
    says so before anything starts. Otherwise Hugging Face's loader takes the path for a Hub
    repository, and the children spend ~45 s failing to download it (no network here) before
    they die with a traceback."""
    folder = Path(path)
    where = "" if folder.is_absolute() else f" (a relative path is read from {Path.cwd()})"
    if not folder.is_dir():
        raise UsageError(f"{field}: {path!r} is not a folder here{where}")
    if not (folder / "config.json").is_file():
        raise UsageError(
            f"{field}: {path!r} has no config.json: not a Hugging Face model folder{where}"
        )
