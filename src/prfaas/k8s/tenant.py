"""A pool's tenant file on Kubernetes: today's rendering of its PD site and gateway, plus what
its ``pool:`` section needs (the rest of ``k8s`` calls these where ``DeploymentConfig.pool`` is
set).

- The pool key is referenced, never held: the pods mount the Secret ``NAME-pool-key`` (key: the
  key id; ``ca.crt``: the front door's CA where ``pool.ca`` is set) and the rendered file's
  ``pool.key`` is that file (``pool.ca`` too). ``--with-secrets`` reads the reference (the
  variable or file, as ``prfaas up`` does) into the Secret.
- A decode node opens a second KV receiver for the pool, keyed by the pool key, on the fixed
  port ``NODE_POOL_KV_PORT`` (the rendered file's ``pool_transfer_port``; registered with the
  pool, ``NodeEndpoint.pool_transfer_port``): ``NAME-pool-kv`` opens that one port on decode
  pods to any source (every frame is authenticated with the tenant's key; narrow it with the
  pool's egress CIDR as an ``ipBlock``).
- No prfaas site: the pool is the PrfaaS site, reached at ``pool.url``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.k8s.names import DECODES_LABEL, NODE_POOL_KV_PORT, POOL_KEY_DIR, Names
from prfaas.pool_file import resolve_key

Manifest = dict[str, Any]

CA_KEY = "ca.crt"
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "0.0.0.0")


def pool_section(d: DeploymentConfig) -> dict[str, Any]:
    """The ``pool:`` section as the pods read it: the key and CA at the Secret's mount."""
    assert d.pool is not None
    raw: dict[str, Any] = d.pool.model_dump(mode="json", exclude_defaults=True)
    raw["key"] = {"id": d.pool.key.id, "file": f"{POOL_KEY_DIR}/{d.pool.key.id}"}
    if d.pool.ca is not None:
        raw["ca"] = f"{POOL_KEY_DIR}/{CA_KEY}"
    return raw


def volume(names: Names) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod volume, container mount) of the pool key's Secret."""
    secret = {"secretName": names.pool_key_secret, "defaultMode": 0o400}
    return (
        {"name": "pool-key", "secret": secret},
        {"name": "pool-key", "mountPath": POOL_KEY_DIR, "readOnly": True},
    )


def pool_key_data(d: DeploymentConfig) -> dict[str, str]:
    """The pool key's Secret's data (``--with-secrets``), read from the file's reference."""
    assert d.pool is not None
    key = resolve_key(d.pool.key, Path.cwd(), "pool.key")
    data = {d.pool.key.id: key.decode()}
    if d.pool.ca is not None:
        data[CA_KEY] = Path(d.pool.ca).read_text(encoding="utf-8")
    return data


def pool_kv_policy(names: Names, namespace: str) -> Manifest:
    """Decode pods' pool receiver reachable from outside the cluster (the pool's nodes)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{names.prefix}-pool-kv",
            "namespace": namespace,
            "labels": names.labels("network-policy"),
        },
        "spec": {
            "podSelector": {"matchLabels": {**names.selector("node"), DECODES_LABEL: "true"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": NODE_POOL_KV_PORT}]}],
        },
    }


def warnings_for(d: DeploymentConfig) -> tuple[str, ...]:
    if d.pool is None:
        return ()
    out = [
        f"pool: the pool's nodes send KV to each decode pod's IP, port {NODE_POOL_KV_PORT} "
        "(NAME-pool-kv opens it to any source): the pool must reach the pod IPs (a flat network "
        "or host networking: docs/kubernetes.md)"
    ]
    host = d.pool.url.split("://", 1)[1].rstrip("/").rsplit(":", 1)[0]
    if host in _LOOPBACK:
        out.append(
            f"pool.url: {d.pool.url!r} is this machine: from a pod it is the pod itself; "
            "name the pool's front door as this cluster reaches it"
        )
    return tuple(out)
