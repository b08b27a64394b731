"""Keys of a deployment file that Kubernetes cannot honour as ``prfaas up`` does: each one is a
stated warning (printed by ``prfaas k8s`` and kept in the rendering's README) or an error, never
silently dropped (issue 23, item 4). The same file still drives ``up``, ``sim`` and ``plan``."""

from __future__ import annotations

from prfaas.config import DeploymentConfig
from prfaas.errors import UsageError
from prfaas.k8s import tenant
from prfaas.perf.profile_file import is_profile_file


def refuse_unrenderable(d: DeploymentConfig) -> None:
    """Errors: what a pod could not run at all."""
    for i, site in enumerate(d.sites):
        if is_profile_file(site.hardware):
            raise UsageError(
                f"sites[{i}].hardware: profile file {site.hardware!r} (site {site.name}) has no "
                "Kubernetes resource mapping: name a hardware preset"
            )
    if d.tls is not None and d.tls.control_plane:
        raise UsageError(
            "tls.control_plane: not rendered for Kubernetes (the probes and the inference "
            "gateway reach the node APIs in plain HTTP); use a mesh's mTLS, or control_plane: false"
        )
    if len(d.gateway.api_keys) > 1:
        raise UsageError(
            "gateway.api_keys: on Kubernetes the client key comes from one Secret "
            "($PRFAAS_API_KEY); the file lists several"
        )


def warnings_for(d: DeploymentConfig) -> tuple[str, ...]:
    out: list[str] = []
    if d.netns:
        out.append(
            "netns: ignored on Kubernetes: every pod has its own network namespace and the "
            "inter-site link is the real network, not a shaped veth"
        )
    for i, site in enumerate(d.sites):
        eng = d.engine_for(site.name)
        if eng.kind != "vllm" and eng.cpus is not None:
            out.append(
                f"sites[{i}] ({site.name}) engine.cpus: pinning inside the pod's cgroup; the cores "
                "must exist in it (kubelet's static CPU manager gives whole cores)"
            )
        if eng.kind == "vllm" and eng.vllm.cpu_bind:
            out.append(
                f"sites[{i}] ({site.name}) engine.vllm.cpu_bind: {eng.vllm.cpu_bind!r} binds "
                "inside the pod; the cores must exist in its cgroup"
            )
    if d.gateway.host not in ("127.0.0.1", "0.0.0.0", "localhost"):
        out.append(
            f"gateway.host: {d.gateway.host!r} replaced: the gateway listens on all of its pod's "
            "addresses and nodes reach it through its control Service"
        )
    if any(n.port or n.transfer_port or n.pool_transfer_port for s in d.sites for n in s.nodes):
        out.append(
            "sites[].nodes[].port / transfer_port / pool_transfer_port: replaced by the pods' "
            "fixed ports (HTTP 8100, KV 8200, the pool's KV 8201; one node process per pod)"
        )
    if any(lk.schedule for lk in d.links):
        out.append("links[].schedule: simulation only (prfaas sim); the real link is not stepped")
    if d.engine.kind == "timed":
        out.append(
            "engine.kind timed: the pods emulate their hardware (no GPU requested); the link is "
            "paced at gbps * byte_divisor / time_scale as under prfaas up"
        )
    return (*out, *tenant.warnings_for(d))
