"""Stable object names, labels and the fixed ports every prfaas pod uses.

Names are ``NAME-...`` DNS labels built from site names (sanitised: ``_`` and ``.`` become
``-``; two sites that collide after that are refused). Role labels follow llm-d's convention
(``llm-d.ai/role: prefill | decode | both``, ``llm-d.ai/inferenceServing: "true"``), beside the
``app.kubernetes.io/*`` ones and prfaas's own (``prfaas.io/site``)."""

from __future__ import annotations

import re

from prfaas.errors import UsageError

GATEWAY_PORT = 8000
"""The gateway's OpenAI listener inside its pod (the file's port unless that is 0)."""
CONTROL_PORT = 8001
"""The gateway's signed control listener inside its pod (the file's unless 0)."""
NODE_HTTP_PORT = 8100
"""Every node process's HTTP API (probes, signed commands)."""
NODE_KV_PORT = 8200
"""Every node process's KV receiver."""
NODE_POOL_KV_PORT = 8201
"""A pool tenant's node pods: the receiver of the pool's KV (under the pool key; decode only)."""

SIDECAR_PORT = 8300
"""The decode-side sidecar's OpenAI port (the InferencePool's target) with ``--inference-pool``."""
EPP_GRPC_PORT = 9002
"""The Endpoint Picker's ext_proc gRPC port (the Gateway API Inference Extension's default)."""
EPP_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090

CONFIG_DIR = "/etc/prfaas/config"
SECRET_DIR = "/etc/prfaas/secret"
TLS_DIR = "/etc/prfaas/tls"
RUN_DIR = "/run/prfaas"
COMPOSED_FILE = f"{RUN_DIR}/deployment.yaml"
NODES_FILE = f"{RUN_DIR}/nodes"
SIDECAR_FILE = f"{RUN_DIR}/sidecar.yaml"

TENANT_KEYS_DIR = "/etc/prfaas/tenant-keys"
"""A pool's pods: ``TENANT/KEY_ID`` (and ``TENANT/receivers-ca.crt``) from the tenants' Secrets."""
POOL_KEY_DIR = "/etc/prfaas/pool-key"
"""A tenant's pods: its pool key ``KEY_ID`` (and the front door's ``ca.crt``) from one Secret."""
POOL_WORKDIR = f"{RUN_DIR}/pool"
"""A pool pod's composed workdir (``pool.resolved.yaml``, the internal key, its nodes file)."""

SITE_LABEL = "prfaas.io/site"
ROLE_LABEL = "llm-d.ai/role"
DECODES_LABEL = "prfaas.io/decodes"
"""``"true"`` on pods that decode (roles decode and both): what the InferencePool selects."""


def dns(part: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", part.lower()).strip("-")


def check_site_names(sites: list[str], field: str = "sites") -> None:
    """Two names that become one Kubernetes name are refused naming ``field``."""
    seen: dict[str, str] = {}
    for site in sites:
        key = dns(site)
        if key in seen:
            raise UsageError(
                f"{field}: {seen[key]!r} and {site!r} become the same Kubernetes name {key!r}"
            )
        seen[key] = site


class Names:
    """Every object name of one rendering, from the ``--name`` prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    @property
    def gateway(self) -> str:
        return f"{self.prefix}-gateway"

    @property
    def gateway_control(self) -> str:
        return f"{self.prefix}-gateway-control"

    def workload(self, site: str, role: str) -> str:
        return f"{self.prefix}-{dns(site)}-{role}"

    @property
    def config(self) -> str:
        return f"{self.prefix}-config"

    @property
    def psk_secret(self) -> str:
        return f"{self.prefix}-psk"

    @property
    def tls_secret(self) -> str:
        return f"{self.prefix}-tls"

    @property
    def api_key_secret(self) -> str:
        return f"{self.prefix}-api-key"

    @property
    def front_door(self) -> str:
        return f"{self.prefix}-front-door"

    @property
    def front_door_control(self) -> str:
        return f"{self.prefix}-front-door-control"

    @property
    def front_door_tls_secret(self) -> str:
        return f"{self.prefix}-front-door-tls"

    def tenant_secret(self, tenant: str) -> str:
        """A pool's Secret of one tenant: its key(s) by id and its receivers' CA."""
        return f"{self.prefix}-tenant-{dns(tenant)}"

    @property
    def pool_key_secret(self) -> str:
        """A tenant's Secret: its pool key (and the front door's CA)."""
        return f"{self.prefix}-pool-key"

    @property
    def epp(self) -> str:
        return f"{self.prefix}-epp"

    @property
    def pool(self) -> str:
        return f"{self.prefix}-pool"

    def labels(self, component: str, **extra: str) -> dict[str, str]:
        out = {
            "app.kubernetes.io/name": "prfaas",
            "app.kubernetes.io/instance": self.prefix,
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/part-of": "prfaas",
        }
        out.update(extra)
        return out

    def selector(self, component: str, **extra: str) -> dict[str, str]:
        """The labels a selector matches on (stable across image and file changes)."""
        out = {"app.kubernetes.io/instance": self.prefix, "app.kubernetes.io/component": component}
        out.update(extra)
        return out


def node_ports(pool_tenant: bool) -> dict[str, int]:
    """A node's ports in its pod (one node process per pod): every rendered node entry's."""
    ports = {"port": NODE_HTTP_PORT, "transfer_port": NODE_KV_PORT}
    if pool_tenant:
        ports["pool_transfer_port"] = NODE_POOL_KV_PORT
    return ports
