"""Disruption budgets and NetworkPolicies.

- A PodDisruptionBudget per node group: one pod at a time may be evicted (its preStop drains it).
- NetworkPolicies: a node's HTTP API (the control surface: signed commands) only from the
  gateway and the deployment's own node pods (cross-site prefix moves call a peer's
  ``/prefix/push``); a node's KV port only from the prefill side (prefill and ``both`` pods); the
  gateway's control port only from node pods; its client port from anywhere (it is the front
  door). A KV sender in another cluster is outside these selectors: docs/kubernetes.md
  (cross-cluster) shows the ipBlock to add."""

from __future__ import annotations

from typing import Any

from prfaas.k8s.groups import NodeGroup
from prfaas.k8s.names import (
    DECODES_LABEL,
    NODE_HTTP_PORT,
    NODE_KV_PORT,
    ROLE_LABEL,
    SIDECAR_PORT,
    Names,
)
from prfaas.k8s.workloads import node_labels, node_selector

Manifest = dict[str, Any]


def disruption_budget(names: Names, g: NodeGroup, namespace: str, model: str) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": g.name,
            "namespace": namespace,
            "labels": node_labels(names, g, model),
        },
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": node_selector(names, g)}},
    }


def tcp_port(port: int | str) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port}


def network_policy(
    names: Names, namespace: str, name: str, selector: dict[str, str], ingress: list[Any]
) -> Manifest:
    """One ingress NetworkPolicy ``NAME-name`` over the pods ``selector`` matches."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{names.prefix}-{name}",
            "namespace": namespace,
            "labels": names.labels("network-policy"),
        },
        "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def network_policies(
    names: Names, namespace: str, control_port: int, picker: bool = False
) -> list[Manifest]:
    """With ``picker`` the Endpoint Picker's pods are the control plane (its ext_proc port open
    to the proxy) and the decode pods' sidecar port is open (the proxy sends requests there)."""
    nodes = {"podSelector": {"matchLabels": names.selector("node")}}
    front = "epp" if picker else "gateway"
    gateway = {"podSelector": {"matchLabels": names.selector(front)}}
    prefill_side = {
        "podSelector": {
            "matchLabels": names.selector("node"),
            "matchExpressions": [
                {"key": ROLE_LABEL, "operator": "In", "values": ["both", "prefill"]}
            ],
        }
    }

    def policy(name: str, selector: dict[str, str], ingress: list[Any]) -> Manifest:
        return network_policy(names, namespace, name, selector, ingress)

    out = [
        policy(
            "node-control",
            names.selector("node"),
            [{"from": [gateway, nodes], "ports": [tcp_port(NODE_HTTP_PORT)]}],
        ),
        policy(
            "node-kv",
            names.selector("node"),
            [{"from": [prefill_side], "ports": [tcp_port(NODE_KV_PORT)]}],
        ),
        policy(
            "gateway",
            names.selector(front),
            [
                {"ports": [tcp_port("http")] + ([tcp_port("grpc")] if picker else [])},
                {"from": [nodes], "ports": [tcp_port(control_port)]},
            ],
        ),
    ]
    if picker:
        out.append(
            policy(
                "node-openai",
                {**names.selector("node"), DECODES_LABEL: "true"},
                [{"ports": [tcp_port(SIDECAR_PORT)]}],
            )
        )
    return out
