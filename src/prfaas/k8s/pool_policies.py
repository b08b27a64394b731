"""A pool's NetworkPolicies (its node groups' PodDisruptionBudgets are ``policies``').

- The front door's tenant API is open: tenants are other clusters, each call signed with its key.
- Its operator control port (node registration and heartbeats, ``/internal/tenants``, ``prfaas
  status`` / ``reload`` through a port-forward) only from pods of the pool's namespace and from
  the ``monitoring`` namespace.
- A pool node's HTTP API (signed prefill commands) only from the front door; nothing may reach a
  pool node's KV port (pool nodes send KV, they receive none: no prefix moves at the pool).
- Egress stays open: pool nodes send KV to the receivers the tenants register, in other
  clusters, at addresses known only at run time (docs/kubernetes.md)."""

from __future__ import annotations

from typing import Any

from prfaas.k8s.names import NODE_HTTP_PORT, Names
from prfaas.k8s.policies import network_policy, tcp_port
from prfaas.k8s.pool_workloads import FRONT_DOOR

Manifest = dict[str, Any]

MONITORING_NAMESPACE = "monitoring"


def pool_network_policies(names: Names, namespace: str) -> list[Manifest]:
    def policy(name: str, selector: dict[str, str], ingress: list[Any]) -> Manifest:
        return network_policy(names, namespace, name, selector, ingress)

    in_namespace: dict[str, Any] = {"podSelector": {}}  # every pod of the namespace
    monitoring = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}}
    }
    front_door = {"podSelector": {"matchLabels": names.selector(FRONT_DOOR)}}
    return [
        policy(
            "front-door",
            names.selector(FRONT_DOOR),
            [
                {"ports": [tcp_port("api")]},
                {"from": [in_namespace, monitoring], "ports": [tcp_port("control")]},
            ],
        ),
        policy(
            "node-control",
            names.selector("node"),
            [{"from": [front_door], "ports": [tcp_port(NODE_HTTP_PORT)]}],
        ),
    ]
