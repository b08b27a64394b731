"""Which pods a deployment becomes: one workload per site and role.

- A node process per pod (one node per pod: a pod is an instance), except a vLLM site whose
  prefill and decode nodes share one server (co-located local route): one pod hosting all of
  them, role ``both``, as ``prfaas up`` runs it.
- PrfaaS sites' prefill nodes are a *scalable group*: a Deployment whose pods are the nodes (a
  node's name is its pod's name; the file's count is the initial size) so that KEDA can resize
  it and a scale-down removes the pod with the lowest ``pod-deletion-cost``.
- Every other group is a StatefulSet with stable pod names; pod ``i`` hosts the group's ``i``-th
  node as the file lists it (``apps.kubernetes.io/pod-index``)."""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.config import DeploymentConfig
from prfaas.k8s.names import Names


@dataclass(frozen=True, slots=True)
class NodeGroup:
    site: str
    site_index: int
    site_kind: str
    """``pd`` or ``prfaas``."""
    role: str
    """``prefill``, ``decode`` or ``both``."""
    node_names: tuple[str, ...]
    """The file's nodes of this group, in file order."""
    scalable: bool
    """A Deployment KEDA may resize (PrfaaS prefill groups)."""
    engine_kind: str
    name: str
    """The workload's (and its headless Service's) name."""

    @property
    def kind(self) -> str:
        return "Deployment" if self.scalable else "StatefulSet"

    @property
    def serve_role(self) -> str:
        """``prfaas serve --role``: ``node`` for a pod hosting both roles."""
        return "node" if self.role == "both" else self.role

    @property
    def sends_kv(self) -> bool:
        return self.role in ("prefill", "both")

    @property
    def receives_kv(self) -> bool:
        return self.role in ("decode", "both")


def node_groups(d: DeploymentConfig, names: Names) -> tuple[NodeGroup, ...]:
    out: list[NodeGroup] = []
    for index, site in enumerate(d.sites):
        kind = d.engine_for(site.name).kind
        roles = sorted({n.role for n in site.nodes})
        if kind == "vllm" and len(roles) == 2:
            everyone = tuple(n.name for n in site.nodes)
            out.append(
                NodeGroup(
                    site.name,
                    index,
                    site.kind,
                    "both",
                    everyone,
                    False,
                    kind,
                    names.workload(site.name, "both"),
                )
            )
            continue
        for role in roles:
            members = tuple(n.name for n in site.nodes if n.role == role)
            scalable = site.kind == "prfaas" and role == "prefill"
            out.append(
                NodeGroup(
                    site.name,
                    index,
                    site.kind,
                    role,
                    members,
                    scalable,
                    kind,
                    names.workload(site.name, role),
                )
            )
    return tuple(out)
