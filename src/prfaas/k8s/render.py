"""``render_deployment``: a validated deployment into its manifests, in a stable order
(ConfigMap, gateway, node groups in file order, budgets, policies, monitoring, scaling, the
inference pool), its Secrets apart, and the warnings for what Kubernetes cannot honour."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.errors import UsageError
from prfaas.k8s import (
    config_files,
    inference,
    monitoring,
    policies,
    secrets,
    tenant,
    unsupported,
)
from prfaas.k8s.groups import NodeGroup, node_groups
from prfaas.k8s.names import Names, check_site_names
from prfaas.k8s.options import RenderOptions
from prfaas.k8s.workloads import gateway_workload, names_safe, node_workload

Manifest = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Rendering:
    manifests: tuple[Manifest, ...]
    """Everything ``kubectl apply`` takes, no key material in any of it."""
    secrets: tuple[Manifest, ...]
    """Secret manifests (only with ``--with-secrets``), written to their own file."""
    warnings: tuple[str, ...]
    groups: tuple[NodeGroup, ...]


def render_deployment(
    d: DeploymentConfig,
    opts: RenderOptions,
    inference_pool: bool = False,
    gateway_name: str = "inference-gateway",
) -> Rendering:
    d.require_one_pd_site()
    unsupported.refuse_unrenderable(d)
    if d.pool is not None and inference_pool:
        raise UsageError(
            "--inference-pool: not rendered for a pool's tenant file (the picker has no pool "
            "key and its pool route is untried)"
        )
    check_site_names([s.name for s in d.sites])
    names = Names(opts.name)
    groups = node_groups(d, names)
    ns = opts.namespace
    model = names_safe(d.engine.model)
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": names.config, "namespace": ns, "labels": names.labels("config")},
        "data": {
            config_files.GATEWAY_FILE: config_files.dump(config_files.gateway_file(d)),
            config_files.NODES_FILE: config_files.dump(config_files.nodes_file(d, names, ns)),
        },
    }
    out: list[Manifest] = [configmap, *gateway_workload(d, names, opts, inference_pool)]
    for g in groups:
        out.extend(node_workload(d, names, opts, g, sidecar=inference_pool))
    out.extend(policies.disruption_budget(names, g, ns, model) for g in groups)
    _, control_port = config_files.gateway_ports(d)
    out.extend(policies.network_policies(names, ns, control_port, inference_pool))
    if d.pool is not None:
        out.append(tenant.pool_kv_policy(names, ns))
    out.append(monitoring.service_monitor(names, ns))
    out.extend(
        monitoring.scaled_object(names, g, ns, opts.prometheus_url) for g in groups if g.scalable
    )
    if inference_pool:
        out.append(inference.inference_pool(names, ns))
        out.extend(inference.picker(d, names, opts))
        out.append(inference.http_route(names, ns, gateway_name))
    keys = tuple(secrets.secret_manifests(d, names, ns)) if opts.with_secrets else ()
    return Rendering(tuple(out), keys, unsupported.warnings_for(d), groups)
