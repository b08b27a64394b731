"""``render_pool``: a validated pool file into its manifests, in a stable order (ConfigMap, the
front door, node groups in file order, budgets, policies), its Secrets apart (``--with-secrets``),
and the warnings for what Kubernetes cannot honour or what is not rendered.

Keys: one Secret per tenant (``NAME-tenant-TENANT``: its key ids, its receivers' CA), not one
for the pool: a tenant's keys are created, rotated and revoked on their own (often synced from
the tenant), and RBAC can grant one tenant's Secret by name; the pods project them all into one
directory. The pool's internal key (front door <-> nodes, what ``prfaas up`` makes per run) is
``NAME-psk``; the front door's TLS ``NAME-front-door-tls``.

A ServiceMonitor scrapes the front door's ``/metrics`` on its control Service (per tenant and per
group: ``pool/metrics.py``). Not rendered: a ScaledObject (a pool file has no autoscaling: its
groups are the file's nodes), a drain hook for pool nodes (a spot group's node takes SIGTERM as
its notice, its pods' grace period covering it: ``pool_workloads.group_timing``; another group's
node stops on SIGTERM)."""

from __future__ import annotations

import secrets as random_keys
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError
from prfaas.k8s import monitoring, policies, pool_files
from prfaas.k8s.names import Names, check_site_names
from prfaas.k8s.options import RenderOptions
from prfaas.k8s.pool_policies import pool_network_policies
from prfaas.k8s.pool_workloads import (
    front_door_workload,
    group_timing,
    group_workload,
    pool_groups,
)
from prfaas.k8s.render import Rendering
from prfaas.k8s.secrets import is_placeholder, secret_manifest
from prfaas.k8s.workloads import names_safe
from prfaas.perf.profile_file import is_profile_file
from prfaas.pool_file import resolve_key
from prfaas.pool_sections import PoolFileConfig

Manifest = dict[str, Any]


def render_pool(pool: PoolFileConfig, path: Path, opts: RenderOptions) -> Rendering:
    """``path``: the pool file (its key files and TLS files are read relative to it)."""
    refuse_unrenderable(pool)
    check_site_names([g.name for g in pool.groups], "groups")
    check_site_names([t.name for t in pool.tenants], "tenants")
    names = Names(opts.name)
    ns = opts.namespace
    groups = pool_groups(pool, names)
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": names.config, "namespace": ns, "labels": names.labels("config")},
        "data": {pool_files.POOL_FILE: pool_files.dump(pool_files.pod_pool_file(pool))},
    }
    out: list[Manifest] = [configmap, *front_door_workload(pool, names, opts)]
    for g in groups:
        out.extend(group_workload(pool, names, opts, g))
    for g in groups:
        model = names_safe(pool.groups[g.site_index].model)
        out.append(policies.disruption_budget(names, g, ns, model))
    out.extend(pool_network_policies(names, ns))
    out.append(monitoring.service_monitor(names, ns, "front-door-control", "control"))
    keys = tuple(pool_secrets(pool, path, names, ns)) if opts.with_secrets else ()
    return Rendering(tuple(out), keys, warnings_for(pool), groups)


def refuse_unrenderable(pool: PoolFileConfig) -> None:
    for i, g in enumerate(pool.groups):
        if g.kind == "vllm":
            raise UsageError(
                f"groups[{i}].kind: 'vllm' pool nodes do not run yet (prfaas up refuses them "
                "too); timed and torch groups render"
            )
        if is_profile_file(g.hardware):
            raise UsageError(
                f"groups[{i}].hardware: profile file {g.hardware!r} (group {g.name}) has no "
                "Kubernetes resource mapping: name a hardware preset"
            )
    conflict = pool.clock_conflict()  # the front door pod would refuse it at start
    if conflict is not None:
        raise UsageError(conflict)


def pool_secrets(pool: PoolFileConfig, path: Path, names: Names, ns: str) -> list[Manifest]:
    """The Secrets (``--with-secrets``): a fresh internal key, each tenant's keys read from their
    references (relative to the pool file, as ``prfaas up`` reads them), the TLS files."""
    base = path.resolve().parent
    out = [secret_manifest(names, ns, names.psk_secret, {"psk": random_keys.token_hex(24)})]
    for i, t in enumerate(pool.tenants):
        data: dict[str, str] = {}
        for j, ref in enumerate(t.keys):
            where = f"tenants.{i}.keys.{j}"
            key = resolve_key(ref, base, where).decode()
            if is_placeholder(key):
                raise UsageError(
                    f"{where}: key {ref.id} is an example's placeholder; --with-secrets will not "
                    "write it into a Secret"
                )
            data[ref.id] = key
        if t.receivers_tls is not None:
            data[pool_files.RECEIVERS_CA] = (base / t.receivers_tls.ca).read_text(encoding="utf-8")
        out.append(secret_manifest(names, ns, names.tenant_secret(t.name), data))
    tls = pool.front_door.tls
    if tls is not None:
        files = {"tls.crt": tls.cert, "tls.key": tls.key}
        data = {k: (base / v).read_text(encoding="utf-8") for k, v in files.items()}
        out.append(
            secret_manifest(names, ns, names.front_door_tls_secret, data, "kubernetes.io/tls")
        )
    return out


def warnings_for(pool: PoolFileConfig) -> tuple[str, ...]:
    out = [
        "pool nodes: no drain hook on termination: a node process stops on SIGTERM as its "
        "server does (requests in flight may finish within the grace period); prefills placed "
        "on it meanwhile fail and their tenants prefill them locally (failed:node_lost)",
    ]
    for g in pool.groups:
        if g.notice_s is not None:
            t = group_timing(g)
            out.append(
                f"groups[].notice_s: group {g.name}: a node pod's SIGTERM is its spot notice "
                "(prefills that end in time finish, the rest go back to the front door's queue "
                f"for another node); the pod's terminationGracePeriodSeconds is {t.grace_s} s "
                f"(its {t.drain_deadline_s} s notice, then the process's own stop)"
            )
    if not pool.front_door.allow_plaintext:  # `prfaas up` would refuse these beyond loopback
        from prfaas.pool_file import plaintext_warnings

        exposed = pool.front_door.model_copy(update={"host": "0.0.0.0"})
        out += [
            f"{why} (the pod serves beyond loopback: set it, or front_door.allow_plaintext)"
            for why in plaintext_warnings(pool.model_copy(update={"front_door": exposed}))
        ]
    if pool.front_door.host not in ("127.0.0.1", "0.0.0.0", "localhost"):
        out.append(
            f"front_door.host: {pool.front_door.host!r} replaced: the front door listens on all "
            "of its pod's addresses; tenants reach it through its Service"
        )
    if any(n.port for g in pool.groups for n in g.nodes):
        out.append("groups[].nodes[].port: replaced by the pods' fixed ports (HTTP 8100, KV 8200)")
    out += [
        f"groups[{i}] ({g.name}) cpus: pinning inside the pod's cgroup; the cores must exist in "
        "it (kubelet's static CPU manager gives whole cores)"
        for i, g in enumerate(pool.groups) if g.cpus is not None
    ]  # fmt: skip
    if any(g.kind == "timed" for g in pool.groups):
        out.append(
            "groups[].kind timed: the pods emulate their hardware (no GPU requested); egress "
            "paced at egress_gbps per group process as under prfaas up"
        )
    if any(g.kind == "torch" for g in pool.groups):
        out.append(
            "groups[].kind torch: run on the engine's default device (cpu), as prfaas up runs "
            "them (a pool group has no device field): no GPU requested"
        )
    out.append(
        "tenants[].keys: a new value under a listed key id reaches the pods' files (kubelet "
        "syncs the Secret) but is read on SIGHUP only (`kubectl exec POD -- kill -HUP 1`); new "
        "tenants or key ids are a ConfigMap change: restart the pods"
    )
    return tuple(out)
