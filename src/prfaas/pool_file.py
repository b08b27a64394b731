"""Reading a pool file and the tenant files that name it; the checks across them; key references.

``load_pool`` and ``load_tenant`` raise one-line ``UsageError``s naming the file and the field:
an unknown tenant or model, a key id the pool does not list for that tenant, units or block size
that differ from the pool's. ``resolve_key`` reads a key reference (environment or file) only when
a live process needs the key; the simulator never does. ``pool_shape`` turns the file into the
pure ``policy.PoolShape`` the admission object (live and simulated) is built from.
``plaintext_warnings`` names what would cross in the clear beyond this machine (``prfaas up``
refuses it unless ``front_door.allow_plaintext``; ``prfaas k8s`` warns).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import ValidationError

from prfaas.config import DeploymentConfig, load_deployment, load_yaml_mapping
from prfaas.errors import UsageError
from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
from prfaas.pool_sections import KeyRef, PoolFileConfig, PoolRef


def is_pool_file(path: Path) -> bool:
    """A pool file has ``groups:`` and ``tenants:`` at the top level (a deployment file has
    ``sites:``)."""
    try:
        raw = load_yaml_mapping(path)
    except UsageError:
        return False
    return "tenants" in raw and "groups" in raw and "sites" not in raw


def load_pool(path: Path) -> PoolFileConfig:
    raw = load_yaml_mapping(path, what="pool file")
    try:
        pool = PoolFileConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise UsageError(f"{path}: {where}: {msg}") from None
    for i, group in enumerate(pool.groups):
        _check_group(path, i, group.kind, group.model, group.hardware)
    base = path.resolve().parent
    files = [(f"front_door.tls.{n}", getattr(pool.front_door.tls, n))
             for n in ("cert", "key") if pool.front_door.tls is not None]  # fmt: skip
    files += [(f"tenants.{i}.receivers_tls.ca", t.receivers_tls.ca)
              for i, t in enumerate(pool.tenants) if t.receivers_tls is not None]  # fmt: skip
    for where, name in files:
        if not (base / name).is_file():  # an absolute name stays itself
            raise UsageError(f"{path}: {where}: file {name!r} does not exist")
    return pool


def _check_group(path: Path, i: int, kind: str, model: str, hardware: str) -> None:
    # A timed node is costed from its model preset and hardware: unknown names fail here.
    if kind != "timed":
        return
    from prfaas.perf.profile_file import is_profile_file
    from prfaas.spec import get_hardware, get_model

    try:
        get_model(model)
    except KeyError as exc:
        raise UsageError(f"{path}: groups.{i}.model: {exc.args[0]}") from None
    if not is_profile_file(hardware):
        try:
            get_hardware(hardware)
        except KeyError as exc:
            raise UsageError(f"{path}: groups.{i}.hardware: {exc.args[0]}") from None


def load_tenant(path: Path, pool: PoolFileConfig, pool_path: Path) -> DeploymentConfig:
    """A tenant's deployment file, checked against the pool it names."""
    cfg = load_deployment(path)
    ref = cfg.pool
    if ref is None:
        raise UsageError(f"{path}: pool: missing (a tenant file names the pool it uses)")
    tenant = pool.tenant(ref.tenant)
    if tenant is None:
        known = ", ".join(t.name for t in pool.tenants)
        raise UsageError(
            f"{path}: pool.tenant: {ref.tenant!r} is not a tenant of {pool_path} (tenants: {known})"
        )
    if pool.group_for_model(cfg.engine.model) is None:
        served = ", ".join(g.model for g in pool.groups)
        raise UsageError(
            f"{path}: engine.model: {cfg.engine.model!r} is not served by {pool_path} "
            f"(served: {served})"
        )
    units = pool.units
    for field, mine, theirs in (
        ("time_scale", cfg.engine.time_scale, units.time_scale),
        ("byte_divisor", cfg.engine.byte_divisor, units.byte_divisor),
        ("block_tokens", cfg.engine.block_tokens, units.block_tokens),
    ):
        if mine != theirs:
            raise UsageError(
                f"{path}: engine.{field}: {mine} differs from the pool's units.{field} {theirs}"
            )
    if ref.key.id not in [k.id for k in tenant.keys]:
        raise UsageError(
            f"{path}: pool.key.id: {ref.key.id!r} is not an active key of tenant {tenant.name}"
        )
    return cfg


def resolve_key(ref: KeyRef, base_dir: Path, where: str) -> bytes:
    """The key a reference names (environment variable or file), at least 16 bytes."""
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if value is None:
            raise UsageError(f"{where}.env: environment variable {ref.env} is not set")
        key = value.encode()
    else:
        assert ref.file is not None
        file = Path(ref.file)
        file = file if file.is_absolute() else base_dir / file
        try:
            key = file.read_bytes().strip()
        except OSError as exc:
            raise UsageError(f"{where}.file: cannot read {file}: {exc.strerror}") from None
    if len(key) < 16:
        raise UsageError(f"{where}: key {ref.id} is shorter than 16 bytes")
    return key


def pool_shape(pool: PoolFileConfig) -> PoolShape:
    """The admission object's view of the pool file (egress in modelled bytes/s)."""
    return PoolShape(
        groups=tuple(
            GroupShape(name=g.name, model=g.model, num_nodes=len(g.node_names)) for g in pool.groups
        ),
        egress_bytes_per_s=pool.egress_gbps * 1e9 / 8,
        tenants=tuple(
            TenantShare(
                name=t.name,
                weight=t.weight,
                floor_nodes=tuple(sorted(t.floor.items())),
                max_queued_tokens=t.cap.max_queued_tokens,
                max_rate_rps=t.cap.max_rate_rps,
            )
            for t in pool.tenants
        ),
        egress_window_s=pool.egress_window_s,
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (a name other than localhost is not)."""
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plaintext_warnings(pool: PoolFileConfig) -> list[str]:
    """What crosses in the clear, when the front door is reachable beyond this machine (each
    names its field): ``prfaas up`` refuses them unless ``front_door.allow_plaintext``."""
    host = pool.front_door.host
    if is_loopback(host):
        return []
    out = []
    if pool.front_door.tls is None:
        out.append(f"front_door.tls is not set: the tenant API on {host} is plain HTTP (signed, "
                   "not private: prompts' tokens are readable on the wire)")  # fmt: skip
    out += [f"tenants.{i}.receivers_tls is not set: {t.name}'s KV crosses in the clear"
            for i, t in enumerate(pool.tenants) if t.receivers_tls is None]  # fmt: skip
    return out


def tenant_in_clear(ref: PoolRef) -> str | None:
    """Why a tenant file's ``pool:`` would send its prompts in the clear beyond this machine (an
    http:// url to another host, without ``allow_plaintext``), naming the field; None if not."""
    url = ref.url.rstrip("/")
    if not url.startswith("http://") or ref.allow_plaintext:
        return None
    if is_loopback(urlsplit(url).hostname or ""):
        return None
    return (
        f"pool.url: {url} is plain HTTP beyond this machine (the prompts' tokens would be "
        "readable on the wire): use https:// with pool.ca, or pool.allow_plaintext: true on a "
        "trusted network"
    )
