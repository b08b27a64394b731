"""A pool's workloads: the front door's Deployment (one replica: it holds the admission state, the
tenants' queues and leases, and the registry of pool nodes) with a Service for the tenants' API
and one for the operator's control port, and one StatefulSet per node group with its headless
Service (pod ``i`` hosts the group's ``i``-th node as the file lists it, like a deployment's
node groups: the front door knows its nodes by the file's names).

Each group is a PrfaaS site of its own in the pods' eyes (``pool.nodes_file``): its pods carry
``prfaas.io/site: GROUP`` and are placed by it (or ``--site-topology GROUP=REGION``), and ask for
the resources ``hardware.pod_resources`` gives the group's engine as ``prfaas up`` runs it."""

from __future__ import annotations

import math
from pathlib import PurePosixPath
from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.k8s import pods
from prfaas.k8s.groups import NodeGroup
from prfaas.k8s.hardware import PodResources, pod_resources
from prfaas.k8s.names import (
    CONFIG_DIR,
    NODE_HTTP_PORT,
    NODE_KV_PORT,
    RUN_DIR,
    SECRET_DIR,
    TENANT_KEYS_DIR,
    TLS_DIR,
    Names,
)
from prfaas.k8s.options import RenderOptions
from prfaas.k8s.pool_files import POOL_FILE, RECEIVERS_CA, front_door_ports
from prfaas.k8s.workloads import names_safe, node_labels, node_selector
from prfaas.pool.nodes_file import group_deployment
from prfaas.pool_sections import PoolFileConfig, PoolGroup

Manifest = dict[str, Any]

FRONT_DOOR = "front-door"
"""The front door pods' component label."""
_NO_KEY = "k8s-render-no-key-material"
"""Stands in for the internal key where a group's node file is built only to read its engine."""


def pool_groups(pool: PoolFileConfig, names: Names) -> tuple[NodeGroup, ...]:
    """One StatefulSet per node group: the group is the site, its nodes prefill."""
    return tuple(
        NodeGroup(
            g.name,
            i,
            "prfaas",
            "prefill",
            tuple(g.node_names),
            False,
            g.kind,
            names.workload(g.name, "prefill"),
        )
        for i, g in enumerate(pool.groups)
    )


def group_engine(pool: PoolFileConfig, g: PoolGroup) -> DeploymentConfig:
    """The deployment a group's process runs (``pool.nodes_file``): its engine as ``prfaas up``
    runs it (a torch group on the engine's default device)."""
    return group_deployment(pool, g, _NO_KEY)


def group_resources(pool: PoolFileConfig, index: int) -> PodResources:
    g = pool.groups[index]
    eng = group_engine(pool, g).engine
    return pod_resources(
        g.name, index, g.hardware, eng.kind, eng.device, eng.threads, f"groups[{index}].hardware"
    )


def _volumes(
    pool: PoolFileConfig, names: Names, opts: RenderOptions, front_door: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts), sorted by name: the ConfigMap, the pool's internal key,
    every tenant's Secret (projected into one directory), the run directory; the front door's
    TLS in its pod, the weights' claim in a torch group's."""
    sources = []
    for t in pool.tenants:
        items = [{"key": k.id, "path": f"{t.name}/{k.id}"} for k in t.keys]
        if t.receivers_tls is not None:
            items.append({"key": RECEIVERS_CA, "path": f"{t.name}/{RECEIVERS_CA}"})
        # optional: a tenant whose Secret is missing is left out (the front door warns), as
        # `prfaas up` leaves out a key that does not resolve; no key at all stops the pool.
        sources.append(
            {"secret": {"name": names.tenant_secret(t.name), "items": items, "optional": True}}
        )
    vols: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.config}},
        {"name": "psk", "secret": {"secretName": names.psk_secret, "defaultMode": 0o400}},
        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        {"name": "tenant-keys", "projected": {"sources": sources, "defaultMode": 0o400}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "psk", "mountPath": SECRET_DIR, "readOnly": True},
        {"name": "run", "mountPath": RUN_DIR},
        {"name": "tenant-keys", "mountPath": TENANT_KEYS_DIR, "readOnly": True},
    ]
    if front_door and pool.front_door.tls is not None:
        secret = {"secretName": names.front_door_tls_secret, "defaultMode": 0o400}
        vols.append({"name": "tls", "secret": secret})
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
    paths = sorted({g.model_path for g in pool.groups if g.model_path})
    if not front_door and paths:
        claim = opts.weights_claim or f"{names.prefix}-weights"
        vols.append(
            {"name": "weights", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
        folders = [str(PurePosixPath(p)) for p in paths]
        mounts.append(
            {"name": "weights", "mountPath": pods.common_parent(folders), "readOnly": True}
        )
    return sorted(vols, key=lambda v: v["name"]), sorted(mounts, key=lambda m: m["name"])


def _meta(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels}


def _service(name: str, namespace: str, labels: dict[str, str], spec: Manifest) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, namespace, labels),
        "spec": spec,
    }


def front_door_workload(pool: PoolFileConfig, names: Names, opts: RenderOptions) -> list[Manifest]:
    """The front door's Deployment, its tenant API Service and its control Service."""
    port, control = front_door_ports(pool)
    labels = names.labels(FRONT_DOOR)
    vols, mounts = _volumes(pool, names, opts, front_door=True)
    pod_sec, ctr_sec = pods.security()
    cmd, args = pods.entry_command("pool-front-door", "--file", POOL_FILE)
    # No drain of its own: a restarted door is a new epoch; tenants prefill locally meanwhile.
    t = pods.Timing(drain_deadline_s=0, grace_s=pods.STOP_GRACE_S, startup_s=120)
    probed = pods.probes("control", t)
    # The control listener is plain HTTP (the tenant port may be TLS) and its /health is open;
    # the door has no /ready of its own: it is ready once it answers, queueing what comes.
    probed["readinessProbe"]["httpGet"]["path"] = "/health"
    container = {
        "name": "front-door",
        "image": opts.image,
        "command": cmd,
        "args": args,
        "ports": [
            {"name": "api", "containerPort": port, "protocol": "TCP"},
            {"name": "control", "containerPort": control, "protocol": "TCP"},
        ],
        **probed,
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
        "volumeMounts": mounts,
        "securityContext": ctr_sec,
    }
    template = {
        "metadata": {"labels": labels},
        "spec": {
            "containers": [container],
            "volumes": vols,
            "securityContext": pod_sec,
            "terminationGracePeriodSeconds": t.grace_s,
            "enableServiceLinks": False,
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(names.front_door, opts.namespace, labels),
        "spec": {
            "replicas": 1,  # one admission state: two doors would each queue half the tenants
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": names.selector(FRONT_DOOR)},
            "template": template,
        },
    }
    api = _service(
        names.front_door,
        opts.namespace,
        labels,
        {
            "selector": names.selector(FRONT_DOOR),
            "ports": [{"name": "api", "port": port, "targetPort": "api", "protocol": "TCP"}],
        },
    )
    control_svc = _service(
        names.front_door_control,
        opts.namespace,
        names.labels("front-door-control"),
        {
            "selector": names.selector(FRONT_DOOR),
            "ports": [
                {"name": "control", "port": control, "targetPort": "control", "protocol": "TCP"}
            ],
        },
    )
    return [deployment, api, control_svc]


def group_timing(g: PoolGroup) -> pods.Timing:
    """A group's pod timing: a spot group's (``notice_s``) deadline on SIGTERM is its notice,
    whole seconds up; the grace period is ``pods.grace_s``'s rule over it (a deployment node's
    over its drain): the notice handling (``serve.node.sigterm_notice``) ends the process by the
    deadline, and its own stop has the margin a deployment node's has. No notice: no deadline."""
    notice_s = 0 if g.notice_s is None else math.ceil(g.notice_s)
    return pods.Timing(notice_s, pods.grace_s(notice_s, g.kind), startup_s=120)


def group_workload(
    pool: PoolFileConfig, names: Names, opts: RenderOptions, g: NodeGroup
) -> list[Manifest]:
    """A node group's StatefulSet and headless Service."""
    res = group_resources(pool, g.site_index)
    model = names_safe(pool.groups[g.site_index].model)
    labels = {**node_labels(names, g, model), "prfaas.io/pool-group": names_safe(g.site)}
    vols, mounts = _volumes(pool, names, opts, front_door=False)
    pod_sec, ctr_sec = pods.security()
    control_host = f"{names.front_door_control}.{opts.namespace}.svc"
    cmd, args = pods.entry_command(
        "pool-node",
        "--file",
        POOL_FILE,
        "--group",
        g.site,
        "--front-door",
        control_host,
        "--host",
        "$(POD_IP)",
    )
    # No drain hook: a stopped pod fails its running prefill (node_lost: its tenant prefills it
    # locally), unless its group has a spot notice: its SIGTERM is then the notice
    # (``pool.node_main``), and the grace period covers the notice, then the process's stop.
    t = group_timing(pool.groups[g.site_index])
    container = {
        "name": "node",
        "image": opts.image,
        "command": cmd,
        "args": args,
        "env": pods.env_from_pod(),
        "ports": [
            {"name": "http", "containerPort": NODE_HTTP_PORT, "protocol": "TCP"},
            {"name": "kv", "containerPort": NODE_KV_PORT, "protocol": "TCP"},
        ],
        **pods.probes("http", t),
        "resources": {"requests": res.requests, "limits": res.limits},
        "volumeMounts": mounts,
        "securityContext": ctr_sec,
    }
    annotations = {"prfaas.io/resources": res.why, "prfaas.io/nodes": ",".join(g.node_names)}
    if t.drain_deadline_s:
        annotations["prfaas.io/notice-s"] = str(t.drain_deadline_s)
    template = {
        "metadata": {"labels": labels, "annotations": annotations},
        "spec": {
            "containers": [container],
            "volumes": vols,
            "affinity": pods.affinity(g.site, opts, res),
            "securityContext": pod_sec,
            "terminationGracePeriodSeconds": t.grace_s,
            "enableServiceLinks": False,
        },
    }
    workload = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(g.name, opts.namespace, labels),
        "spec": {
            "replicas": len(g.node_names),
            "selector": {"matchLabels": node_selector(names, g)},
            "serviceName": g.name,
            "podManagementPolicy": "Parallel",
            "template": template,
        },
    }
    headless = _service(
        g.name,
        opts.namespace,
        labels,
        {
            "clusterIP": "None",
            "selector": node_selector(names, g),
            "ports": [
                {"name": "http", "port": NODE_HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "kv", "port": NODE_KV_PORT, "targetPort": "kv", "protocol": "TCP"},
            ],
        },
    )
    return [workload, headless]
