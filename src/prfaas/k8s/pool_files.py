"""The pool file as a pool's pods read it (``pool.yaml`` in the pool's ConfigMap), holding no key.

From the operator's pool file: the front door listens on all its pod's addresses at fixed ports
(the file's, or 8100/8101 for 0); every tenant key reference becomes a file in the mounted
tenants' Secrets (``TENANT_KEYS_DIR/TENANT/KEY_ID``), each tenant's ``receivers_tls.ca`` that
Secret's ``receivers-ca.crt``, and ``front_door.tls`` the front door's TLS Secret's files. A node
pod's entry points ``front_door.host`` at the control Service (``pool_entry``). Serialised with
sorted keys: deterministic."""

from __future__ import annotations

from typing import Any

from prfaas.k8s.names import TENANT_KEYS_DIR, TLS_DIR
from prfaas.k8s.yaml_text import dump_yaml
from prfaas.pool_sections import PoolFileConfig

POOL_FILE = "pool.yaml"
"""The ConfigMap's key (and the file name under the mounted config directory)."""
RECEIVERS_CA = "receivers-ca.crt"
"""A tenant Secret's key holding its receivers' CA (``tenants[].receivers_tls.ca``)."""
DEFAULT_PORT = 8100
DEFAULT_CONTROL_PORT = 8101


def front_door_ports(pool: PoolFileConfig) -> tuple[int, int]:
    """(tenant API port, operator control port) inside the front door's pod."""
    door = pool.front_door
    return door.port or DEFAULT_PORT, door.control_port or DEFAULT_CONTROL_PORT


def key_path(tenant: str, key_id: str) -> str:
    return f"{TENANT_KEYS_DIR}/{tenant}/{key_id}"


def receivers_ca_path(tenant: str) -> str:
    return f"{TENANT_KEYS_DIR}/{tenant}/{RECEIVERS_CA}"


def pod_pool_file(pool: PoolFileConfig) -> dict[str, Any]:
    raw: dict[str, Any] = pool.model_dump(mode="json", exclude_defaults=True)
    port, control = front_door_ports(pool)
    door = dict(raw.get("front_door", {}))
    door.update(host="0.0.0.0", port=port, control_port=control)
    if pool.front_door.tls is not None:
        door["tls"] = {"cert": f"{TLS_DIR}/tls.crt", "key": f"{TLS_DIR}/tls.key"}
    raw["front_door"] = door
    tenants = []
    for t, entry in zip(pool.tenants, raw["tenants"], strict=True):
        entry = dict(entry)
        entry["keys"] = [{"id": k.id, "file": key_path(t.name, k.id)} for k in t.keys]
        if t.receivers_tls is not None:
            entry["receivers_tls"] = {
                "ca": receivers_ca_path(t.name),
                "server_hostname": t.receivers_tls.server_hostname,
            }
        tenants.append(entry)
    raw["tenants"] = tenants
    return raw


def dump(raw: dict[str, Any]) -> str:
    head = "# Rendered by `prfaas k8s`; tenant keys are files of the mounted tenants' Secrets.\n"
    return head + dump_yaml(raw)
