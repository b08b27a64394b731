"""The Gateway API Inference Extension objects (``--inference-pool``): an ``InferencePool``
(inference.networking.k8s.io/v1) over the deployment's decode pods, the Endpoint Picker
(``prfaas epp``) as a Deployment and Service, and an example ``HTTPRoute`` sending a Gateway's
traffic to the pool.

The pool's target port is the decode pods' sidecar (``prfaas epp-sidecar``, port 8300), which
runs the prefill where the picker's header says and then the decode (docs/kubernetes.md)."""

from __future__ import annotations

from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.k8s import pods
from prfaas.k8s.config_files import GATEWAY_FILE, gateway_ports
from prfaas.k8s.names import (
    CONFIG_DIR,
    DECODES_LABEL,
    EPP_GRPC_PORT,
    EPP_HEALTH_PORT,
    RUN_DIR,
    SECRET_DIR,
    SIDECAR_PORT,
    Names,
)
from prfaas.k8s.options import RenderOptions

Manifest = dict[str, Any]


def inference_pool(names: Names, namespace: str) -> Manifest:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {
            "name": names.pool,
            "namespace": namespace,
            "labels": names.labels("inference-pool"),
        },
        "spec": {
            # decode pods and pods serving both roles (llm-d's role label is not a set, so a
            # label of its own): where a request's tokens come from
            "selector": {
                "matchLabels": {
                    "app.kubernetes.io/instance": names.prefix,
                    DECODES_LABEL: "true",
                }
            },
            "targetPorts": [{"number": SIDECAR_PORT}],
            "endpointPickerRef": {
                "name": names.epp,
                "port": {"number": EPP_GRPC_PORT},
                "failureMode": "FailClose",
            },
        },
    }


def picker(d: DeploymentConfig, names: Names, opts: RenderOptions) -> list[Manifest]:
    """The picker: a gateway process (nodes register with it; its OpenAI port serves
    ``/metrics``) whose routes go to the proxy over ext_proc."""
    labels = names.labels("epp")
    port, control = gateway_ports(d)
    vols, mounts = pods_volumes(names, opts)
    pod_sec, ctr_sec = pods.security()
    cmd, args = pods.entry_command(
        "epp",
        "--file",
        GATEWAY_FILE,
        "--grpc-port",
        str(EPP_GRPC_PORT),
        "--health-port",
        str(EPP_HEALTH_PORT),
    )

    def grpc_probe(service: str) -> dict[str, Any]:
        return {"grpc": {"port": EPP_HEALTH_PORT, "service": service}, "periodSeconds": 5}

    container = {
        "name": "epp",
        "image": opts.image,
        "command": cmd,
        "args": args,
        "ports": [
            {"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
            {"name": "http", "containerPort": port, "protocol": "TCP"},
            {"name": "control", "containerPort": control, "protocol": "TCP"},
        ],
        "livenessProbe": grpc_probe("liveness"),
        "readinessProbe": grpc_probe("readiness"),
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": mounts,
        "securityContext": ctr_sec,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": names.epp, "namespace": opts.namespace, "labels": labels},
        "spec": {
            "replicas": 1,  # its load and prefix view are its own: docs/kubernetes.md
            "selector": {"matchLabels": names.selector("epp")},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container],
                    "volumes": vols,
                    "securityContext": pod_sec,
                    "enableServiceLinks": False,
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": names.epp, "namespace": opts.namespace, "labels": labels},
        "spec": {
            "selector": names.selector("epp"),
            "ports": [
                {
                    "name": "grpc",
                    "port": EPP_GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "http2",
                },
            ],
        },
    }
    return [deployment, service]


def pods_volumes(names: Names, opts: RenderOptions) -> tuple[list[Any], list[Any]]:
    vols = [
        {"name": "config", "configMap": {"name": names.config}},
        {"name": "psk", "secret": {"secretName": names.psk_secret, "defaultMode": 0o400}},
        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
    ]
    mounts = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "psk", "mountPath": SECRET_DIR, "readOnly": True},
        {"name": "run", "mountPath": RUN_DIR},
    ]
    return vols, mounts


def http_route(names: Names, namespace: str, gateway_name: str) -> Manifest:
    """An example route: every path of ``gateway_name`` (a Gateway the cluster already has) to
    the pool. Not validated here (Gateway API's CRDs are not among the pinned ones)."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {
            "name": names.pool,
            "namespace": namespace,
            "labels": names.labels("route"),
        },
        "spec": {
            "parentRefs": [{"name": gateway_name}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                    "backendRefs": [
                        {
                            "group": "inference.networking.k8s.io",
                            "kind": "InferencePool",
                            "name": names.pool,
                        }
                    ],
                    "timeouts": {"request": "600s"},
                }
            ],
        },
    }
