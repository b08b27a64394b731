"""Prometheus scraping (a ServiceMonitor over the gateway's, or a pool front door's,
``/metrics``) and a KEDA ``ScaledObject`` per scalable PrfaaS group.

The scaler reads prfaas's own backlog as the gateway exports it today: the prefill queue of the
group's nodes, ``prfaas_stage_queue_depth{stage="prefill_queue", node=~"<group>-.*"}`` (a
Deployment's pod, and so its node, is named ``<group>-<hash>``), summed; KEDA keeps about
``--queue-per-node`` queued prefills per pod. Where the elastic autoscaler's desired size
(``prfaas_autoscale_desired_nodes{group=...}``) is exported, that metric is the alternative
query (docs/kubernetes.md)."""

from __future__ import annotations

from typing import Any

from prfaas.k8s.groups import NodeGroup
from prfaas.k8s.names import Names

Manifest = dict[str, Any]

QUEUE_PER_NODE = 2
"""Target queued prefills per PrfaaS node before KEDA adds one."""
MAX_SCALE_FACTOR = 4
"""The group may grow to this many times its file's count."""


def service_monitor(
    names: Names, namespace: str, component: str = "gateway", port: str = "http"
) -> Manifest:
    """Scrape ``/metrics`` on ``port`` of the Services labelled ``component`` (a deployment's
    gateway; a pool's front door control Service)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {
            "name": names.prefix,
            "namespace": namespace,
            "labels": names.labels("monitoring"),
        },
        "spec": {
            "selector": {"matchLabels": names.selector(component)},
            "namespaceSelector": {"matchNames": [namespace]},
            "endpoints": [{"port": port, "path": "/metrics", "interval": "15s"}],
        },
    }


def backlog_query(g: NodeGroup) -> str:
    return (
        f'sum(prfaas_stage_queue_depth{{stage="prefill_queue",node=~"{g.name}-.*"}}) or vector(0)'
    )


def scaled_object(names: Names, g: NodeGroup, namespace: str, prometheus_url: str) -> Manifest:
    count = len(g.node_names)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": g.name,
            "namespace": namespace,
            "labels": names.labels("autoscaling"),
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": g.name},
            "minReplicaCount": count,
            "maxReplicaCount": max(count * MAX_SCALE_FACTOR, count + 1),
            "pollingInterval": 15,
            "cooldownPeriod": 300,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        # one pod at a time down: each drains before it goes
                        "scaleDown": {
                            "stabilizationWindowSeconds": 300,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                        }
                    }
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": backlog_query(g),
                        "threshold": str(QUEUE_PER_NODE),
                    },
                }
            ],
        },
    }
