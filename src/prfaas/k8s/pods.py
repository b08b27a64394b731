"""Pod templates: the prfaas container (entry, ports, probes, drain on termination, resources),
its volumes (the ConfigMap, the key's Secret by name, the weights' claim, a memory-backed run
directory) and where it may run (node affinity by site topology and GPU product).

Termination drains: ``preStop`` runs ``python -m prfaas.k8s.entry drain``, which takes the pod's
nodes out of rotation at the gateway and waits until they are idle or the drain deadline passes
(the gateway's ``request_timeout_s``: no request outlives it); SIGTERM follows. The grace period is
the drain deadline plus the process's own stop time, so the kubelet never kills a draining pod
(``grace_s``: the one rule, also for a pool's spot node, whose deadline is its notice)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.k8s import tenant
from prfaas.k8s.hardware import GPU_PRODUCT_LABEL, PodResources
from prfaas.k8s.names import (
    CONFIG_DIR,
    RUN_DIR,
    SECRET_DIR,
    SITE_LABEL,
    TLS_DIR,
    Names,
)
from prfaas.k8s.options import RenderOptions

STOP_GRACE_S = 30
"""After the drain: the process's own shutdown (a vLLM server's group included)."""
VLLM_STOP_GRACE_S = 60
PROBE_PERIOD_S = 5
UID = 10001


@dataclass(frozen=True, slots=True)
class Timing:
    drain_deadline_s: int
    grace_s: int
    startup_s: int


def grace_s(deadline_s: int, engine_kind: str) -> int:
    """A pod's ``terminationGracePeriodSeconds``: the deadline its process has on termination (a
    deployment node's drain, a pool spot node's notice, 0: none) plus the process's own stop
    time, so the kubelet kills no pod before its process could end on its own."""
    return deadline_s + (VLLM_STOP_GRACE_S if engine_kind == "vllm" else STOP_GRACE_S)


def timing(d: DeploymentConfig, engine_kind: str, startup_timeout_s: float) -> Timing:
    drain = math.ceil(d.gateway.request_timeout_s)
    startup = math.ceil(startup_timeout_s) if engine_kind == "vllm" else 120
    return Timing(drain, grace_s(drain, engine_kind), startup)


def env_from_pod() -> list[dict[str, Any]]:
    def field(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    return [
        field("POD_NAME", "metadata.name"),
        field("POD_IP", "status.podIP"),
        field("POD_INDEX", "metadata.labels['apps.kubernetes.io/pod-index']"),
    ]


def probes(port: str, t: Timing) -> dict[str, Any]:
    def get(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": port}}

    return {
        "startupProbe": {
            **get("/health"),
            "periodSeconds": PROBE_PERIOD_S,
            "failureThreshold": max(1, math.ceil(t.startup_s / PROBE_PERIOD_S)),
        },
        "livenessProbe": {
            **get("/health"),
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "readinessProbe": {**get("/ready"), "periodSeconds": PROBE_PERIOD_S, "failureThreshold": 2},
    }


def volumes(
    d: DeploymentConfig, names: Names, opts: RenderOptions, weights: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts), sorted by name."""
    vols: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.config}},
        {"name": "psk", "secret": {"secretName": names.psk_secret, "defaultMode": 0o400}},
        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "psk", "mountPath": SECRET_DIR, "readOnly": True},
        {"name": "run", "mountPath": RUN_DIR},
    ]
    if d.tls is not None:
        vols.append(
            {"name": "tls", "secret": {"secretName": names.tls_secret, "defaultMode": 0o400}}
        )
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
    if d.pool is not None:  # a tenant: its gateway signs with the key, decode nodes receive
        vol, mount = tenant.volume(names)
        vols.append(vol)
        mounts.append(mount)
    if weights:
        paths = {d.engine_for(s.name).model_path for s in d.sites} | {d.engine.model_path}
        claim = opts.weights_claim or f"{names.prefix}-weights"
        vols.append(
            {"name": "weights", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
        # The model folders are read at the paths the file names: the claim is mounted at the
        # common parent of them all.
        folders = sorted(str(PurePosixPath(p)) for p in paths if p)
        mounts.append({"name": "weights", "mountPath": common_parent(folders), "readOnly": True})
    return sorted(vols, key=lambda v: v["name"]), sorted(mounts, key=lambda m: m["name"])


def common_parent(paths: list[str]) -> str:
    parts = [PurePosixPath(p).parent.parts for p in paths]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    path = str(PurePosixPath(*common)) if common else "/models"
    return "/models" if path in ("/", ".") else path


def affinity(site: str, opts: RenderOptions, res: PodResources | None) -> dict[str, Any]:
    where = opts.topology.get(site)
    exprs: list[dict[str, Any]] = []
    if where is None:
        exprs.append({"key": SITE_LABEL, "operator": "In", "values": [site]})
    else:
        exprs.append(
            {"key": "topology.kubernetes.io/region", "operator": "In", "values": [where.region]}
        )
        if where.zone is not None:
            exprs.append(
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [where.zone]}
            )
    if res is not None and res.gpu_product is not None:
        exprs.append({"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [res.gpu_product]})
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": exprs}]
            }
        }
    }


def security() -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod securityContext, container securityContext)."""
    pod = {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return pod, container


def entry_command(*args: str) -> tuple[list[str], list[str]]:
    return ["python", "-m", "prfaas.k8s.entry"], list(args)


def pre_stop_drain(t: Timing) -> dict[str, Any]:
    cmd, args = entry_command("drain", "--timeout", str(t.drain_deadline_s))
    return {"preStop": {"exec": {"command": cmd + args}}}
