"""The workloads: the gateway's Deployment (one replica: it holds the node registry and the
KV mirror of its PD site) and one StatefulSet or Deployment per node group (``groups``), each
with its headless Service (stable DNS per pod)."""

from __future__ import annotations

from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.k8s import pods
from prfaas.k8s.config_files import GATEWAY_FILE, NODES_FILE, gateway_ports
from prfaas.k8s.groups import NodeGroup
from prfaas.k8s.hardware import pod_resources
from prfaas.k8s.names import (
    DECODES_LABEL,
    NODE_HTTP_PORT,
    NODE_KV_PORT,
    NODE_POOL_KV_PORT,
    ROLE_LABEL,
    SIDECAR_PORT,
    SITE_LABEL,
    Names,
)
from prfaas.k8s.options import RenderOptions

Manifest = dict[str, Any]


def _meta(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels}


def node_labels(names: Names, g: NodeGroup, model: str) -> dict[str, str]:
    return names.labels(
        "node",
        **{
            SITE_LABEL: g.site,
            "prfaas.io/site-kind": g.site_kind,
            ROLE_LABEL: g.role,
            "llm-d.ai/inferenceServing": "true",
            "llm-d.ai/model": model,
            DECODES_LABEL: "true" if g.receives_kv else "false",
        },
    )


def node_selector(names: Names, g: NodeGroup) -> dict[str, str]:
    return names.selector("node", **{SITE_LABEL: g.site, ROLE_LABEL: g.role})


def node_workload(
    d: DeploymentConfig, names: Names, opts: RenderOptions, g: NodeGroup, sidecar: bool = False
) -> list[Manifest]:
    """The group's workload and headless Service; with ``sidecar`` its decode pods also run
    ``prfaas epp-sidecar`` (the OpenAI port the Endpoint Picker routes to)."""
    eng = d.engine_for(g.site)
    res = pod_resources(
        g.site, g.site_index, d.sites[g.site_index].hardware, eng.kind, eng.device, eng.threads
    )
    t = pods.timing(d, eng.kind, eng.vllm.startup_timeout_s)
    model = names_safe(d.engine.model)
    labels = node_labels(names, g, model)
    vols, mounts = pods.volumes(d, names, opts, weights=eng.kind in ("torch", "vllm"))
    pod_sec, ctr_sec = pods.security()
    cmd, args = pods.entry_command(
        "node",
        "--file",
        NODES_FILE,
        "--site",
        g.site,
        "--role",
        g.serve_role,
        "--pod-group",
        "deployment" if g.scalable else "statefulset",
        "--host",
        "$(POD_IP)",
    )
    env = pods.env_from_pod()
    if g.scalable:  # a Deployment's pods have no index: their node is named after the pod
        env = [e for e in env if e["name"] != "POD_INDEX"]
    container = {
        "name": "node",
        "image": opts.image,
        "command": cmd,
        "args": args,
        "env": env,
        "ports": [
            {"name": "http", "containerPort": NODE_HTTP_PORT, "protocol": "TCP"},
            {"name": "kv", "containerPort": NODE_KV_PORT, "protocol": "TCP"},
            *(
                [{"name": "pool-kv", "containerPort": NODE_POOL_KV_PORT, "protocol": "TCP"}]
                if d.pool is not None and g.receives_kv
                else []
            ),
        ],
        **pods.probes("http", t),
        "lifecycle": pods.pre_stop_drain(t),
        "resources": {"requests": res.requests, "limits": res.limits},
        "volumeMounts": mounts,
        "securityContext": ctr_sec,
    }
    annotations = {
        "prfaas.io/resources": res.why,
        "prfaas.io/nodes": ",".join(g.node_names),
        "prfaas.io/drain-deadline-s": str(t.drain_deadline_s),
    }
    if g.scalable:  # scale-down removes the lowest; `kubectl annotate` a drained pod lower
        annotations["controller.kubernetes.io/pod-deletion-cost"] = "0"
    containers = [container]
    if sidecar and g.receives_kv:
        containers.append(_sidecar_container(opts, g, t, mounts, ctr_sec, env))
    template = {
        "metadata": {"labels": labels, "annotations": annotations},
        "spec": {
            "containers": containers,
            "volumes": vols,
            "affinity": pods.affinity(g.site, opts, res),
            "securityContext": pod_sec,
            "terminationGracePeriodSeconds": t.grace_s,
            "enableServiceLinks": False,
        },
    }
    spec: dict[str, Any] = {
        "replicas": 1 if g.role == "both" else len(g.node_names),
        "selector": {"matchLabels": node_selector(names, g)},
        "template": template,
    }
    if g.scalable:
        spec["strategy"] = {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }
    else:
        spec["serviceName"] = g.name
        spec["podManagementPolicy"] = "Parallel"
    workload = {
        "apiVersion": "apps/v1",
        "kind": g.kind,
        "metadata": _meta(g.name, opts.namespace, labels),
        "spec": spec,
    }
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(g.name, opts.namespace, labels),
        "spec": {
            "clusterIP": "None",
            "selector": node_selector(names, g),
            "ports": [
                {"name": "http", "port": NODE_HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "kv", "port": NODE_KV_PORT, "targetPort": "kv", "protocol": "TCP"},
            ],
        },
    }
    return [workload, headless]


def _sidecar_container(
    opts: RenderOptions,
    g: NodeGroup,
    t: pods.Timing,
    mounts: list[dict[str, Any]],
    security: dict[str, Any],
    env: list[dict[str, Any]],
) -> dict[str, Any]:
    cmd, args = pods.entry_command(
        "sidecar",
        "--file",
        NODES_FILE,
        "--site",
        g.site,
        "--role",
        g.serve_role,
        "--pod-group",
        "deployment" if g.scalable else "statefulset",
        "--port",
        str(SIDECAR_PORT),
    )
    return {
        "name": "sidecar",
        "image": opts.image,
        "command": cmd,
        "args": args,
        "env": env,
        "ports": [{"name": "openai", "containerPort": SIDECAR_PORT, "protocol": "TCP"}],
        **pods.probes("openai", t),
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": mounts,
        "securityContext": security,
    }


def names_safe(value: str) -> str:
    """A label value (63 characters of [A-Za-z0-9._-], alphanumeric at both ends)."""
    import re

    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", value)[:63].strip("-_.")
    return cleaned or "model"


def gateway_workload(
    d: DeploymentConfig, names: Names, opts: RenderOptions, picker: bool = False
) -> list[Manifest]:
    """The gateway's Deployment and its two Services; with ``picker`` the Endpoint Picker is the
    control plane (``prfaas epp`` is a gateway whose routes go to Envoy): the Services select
    its pods and no gateway Deployment is rendered."""
    home = d.engine_for(d.home_site.name)
    t = pods.timing(d, "gateway", 0)
    port, control = gateway_ports(d)
    labels = names.labels("gateway")
    needs_model = home.kind in ("torch", "vllm") or d.engine.kind == "torch"
    vols, mounts = pods.volumes(d, names, opts, weights=needs_model)
    pod_sec, ctr_sec = pods.security()
    cmd, args = pods.entry_command("gateway", "--file", GATEWAY_FILE)
    env = [
        {
            "name": "PRFAAS_API_KEY",
            "valueFrom": {
                "secretKeyRef": {"name": names.api_key_secret, "key": "api-key", "optional": True}
            },
        }
    ]
    container = {
        "name": "gateway",
        "image": opts.image,
        "command": cmd,
        "args": args,
        "env": env,
        "ports": [
            {"name": "http", "containerPort": port, "protocol": "TCP"},
            {"name": "control", "containerPort": control, "protocol": "TCP"},
        ],
        **pods.probes("http", t),
        # No drain of its own: the endpoints update first, then uvicorn finishes what it holds.
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
            "affinity": pods.affinity(d.home_site.name, opts, None),
            "securityContext": pod_sec,
            "terminationGracePeriodSeconds": t.grace_s,
            "enableServiceLinks": False,
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(names.gateway, opts.namespace, labels),
        "spec": {
            "replicas": 1,  # one registry per PD site: two gateways would split the nodes
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": names.selector("gateway")},
            "template": template,
        },
    }
    front = "epp" if picker else "gateway"
    client = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(names.gateway, opts.namespace, labels),
        "spec": {
            "selector": names.selector(front),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    control_svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(names.gateway_control, opts.namespace, names.labels("gateway-control")),
        "spec": {
            "selector": names.selector(front),
            "ports": [
                {"name": "control", "port": control, "targetPort": "control", "protocol": "TCP"}
            ],
        },
    }
    return [client, control_svc] if picker else [deployment, client, control_svc]
