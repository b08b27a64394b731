"""Keys: by default the manifests name their Secrets and hold no key material; with
``--with-secrets`` the Secret manifests are rendered (for test clusters), kept out of the main
file by the emitter (a separate file, mode 0600).

The key source is the deployment file's ``psk`` (pods started one by one must share it, as
``prfaas serve`` requires); a file without one is refused, except a pool's tenant file (its
``psk`` is its own pods' only: ``--with-secrets`` writes the file's, or a fresh one), whose pool
key comes from its ``pool.key`` reference (``tenant``). The examples' placeholder keys are
refused when they would be written into a Secret."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.errors import UsageError
from prfaas.k8s import tenant
from prfaas.k8s.names import Names

Manifest = dict[str, Any]

PLACEHOLDER_MARKS = ("change-me", "not-a-secret", "changeme", "placeholder", "example")
"""Words the shipped examples' keys carry: such a key is public, never a cluster's secret."""


def is_placeholder(key: str) -> bool:
    low = key.lower()
    return any(mark in low for mark in PLACEHOLDER_MARKS)


def require_key_source(raw: dict[str, Any], path: Path) -> None:
    if "psk" not in raw:
        raise UsageError(
            f"{path}: psk: missing. The pods share the deployment's key from the Secret the "
            "manifests name; put `psk:` in the file (written only with --with-secrets) and create "
            "the Secret yourself otherwise"
        )


def secret_manifest(
    names: Names, namespace: str, name: str, data: dict[str, str], kind: str = "Opaque"
) -> Manifest:
    """One Secret of the rendering (its values base64-encoded, keys sorted)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": names.labels("secret")},
        "type": kind,
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())},
    }


def secret_manifests(d: DeploymentConfig, names: Names, namespace: str) -> list[Manifest]:
    if is_placeholder(d.psk):
        raise UsageError(
            "psk: the file holds an example's placeholder key; --with-secrets will not write it "
            "into a Secret: put a random key of at least 16 characters in the file"
        )

    def secret(name: str, data: dict[str, str]) -> Manifest:
        return secret_manifest(names, namespace, name, data)

    keys = {"psk": d.psk}
    if d.accept_psks:  # a rotation under way: the old keys travel with the new one
        keys["accept_psks"] = "\n".join(d.accept_psks)
    out = [secret(names.psk_secret, keys)]
    if d.tls is not None:
        files = {"tls.crt": d.tls.cert, "tls.key": d.tls.key, "ca.crt": d.tls.ca}
        data = {k: Path(v).read_text(encoding="utf-8") for k, v in files.items()}
        out.append(secret(names.tls_secret, data))
    if d.gateway.api_keys:
        out.append(secret(names.api_key_secret, {"api-key": d.gateway.api_keys[0]}))
    if d.pool is not None:  # a tenant of a pool: its pool key (and the front door's CA)
        data = tenant.pool_key_data(d)
        if is_placeholder(data[d.pool.key.id]):
            raise UsageError(
                f"pool.key: {d.pool.key.id} holds an example's placeholder key; --with-secrets "
                "will not write it into a Secret"
            )
        out.append(secret(names.pool_key_secret, data))
    return out
