"""The deployment file as the pods read it: two variants in one ConfigMap, neither holding a key.

``gateway.yaml``: the gateway listens on all its pod's addresses. ``nodes.yaml``: nodes reach the
gateway through its control Service. Both: fixed pod ports, no ``psk`` (the pod's entry adds it
from the mounted Secret), no ``gateway.api_keys`` (``$PRFAAS_API_KEY`` from a Secret), TLS files
at the mounted Secret's paths, ``netns`` off; a tenant's ``pool.key`` (and ``pool.ca``) at its
pool key Secret's mount. Serialised with sorted keys: the rendering is
deterministic."""

from __future__ import annotations

from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.k8s import tenant
from prfaas.k8s.names import (
    CONTROL_PORT,
    GATEWAY_PORT,
    TLS_DIR,
    Names,
    node_ports,
)
from prfaas.k8s.yaml_text import dump_yaml

GATEWAY_FILE = "gateway.yaml"
NODES_FILE = "nodes.yaml"


def gateway_ports(d: DeploymentConfig) -> tuple[int, int]:
    """(client port, control port) inside the gateway pod: the file's, or the defaults for 0."""
    return d.gateway.port or GATEWAY_PORT, d.gateway.control_port or CONTROL_PORT


def _base(d: DeploymentConfig) -> dict[str, Any]:
    raw: dict[str, Any] = d.model_dump(mode="json", exclude_defaults=True)
    raw.pop("psk", None)
    raw.pop("accept_psks", None)  # keys too: in the psk Secret, composed back by the entry
    raw.pop("netns", None)
    gateway = dict(raw.get("gateway", {}))
    gateway.pop("api_keys", None)
    port, control = gateway_ports(d)
    gateway["port"], gateway["control_port"] = port, control
    raw["gateway"] = gateway
    ports = node_ports(d.pool is not None)
    for site in raw["sites"]:
        site["nodes"] = [{**n, **ports} for n in site["nodes"]]
    if d.pool is not None:  # a pool's tenant: its pool key at the Secret's mount
        raw["pool"] = tenant.pool_section(d)
    if d.tls is not None:
        raw["tls"] = {
            "cert": f"{TLS_DIR}/tls.crt",
            "key": f"{TLS_DIR}/tls.key",
            "ca": f"{TLS_DIR}/ca.crt",
            "server_hostname": d.tls.server_hostname,
        }
    return raw


def gateway_file(d: DeploymentConfig) -> dict[str, Any]:
    raw = _base(d)
    raw["gateway"]["host"] = "0.0.0.0"
    return raw


def nodes_file(d: DeploymentConfig, names: Names, namespace: str) -> dict[str, Any]:
    raw = _base(d)
    raw["gateway"]["host"] = f"{names.gateway_control}.{namespace}.svc"
    return raw


def dump(raw: dict[str, Any]) -> str:
    head = "# Rendered by `prfaas k8s`; the pod's entry adds psk from its Secret.\n"
    return head + dump_yaml(raw)
