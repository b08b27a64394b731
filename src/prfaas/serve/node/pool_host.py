"""``PoolNodeHost``: a PrfaaS pool's node process (``pool.node_main``; ``docs/pool.md``): a
``serve.node.host.WorkerHost`` with what only a pool node does.

- **Per-tenant routes**: a pool node has no one link: each tenant's KV crosses that tenant's own
  link, so it goes on a route of its own (``"{site}->{tenant}"``, named by the
  ``PrefillCommand``: ``route_of``), paced at the rate the tenant told the pool, converted to
  wall payload bytes/s as the host converts a deployment's link, and every route shares the
  process-wide egress cap (the pool's ``egress_gbps``, converted the same way:
  ``LinkPool(egress_cap_bytes_per_s=...)``). The group's one link of its node file is not paced,
  and ``/link/rate`` is refused (409). With ``netns: true`` nothing is paced, as for a deployment.
- **Per-tenant prefix namespaces**: its prefix store keeps each tenant's prefixes in a namespace
  of its own, under a quota (``prefix_namespaces``): the host hashes a pool prefill's prompt into
  its tenant's salted chain itself (whatever hashes the command carries), and its heartbeat
  carries the store per namespace besides the store's change journal, which the front door
  mirrors (``pool/prefix_hits.py``: it places a prefill where its tenant's prefix is, computing
  the same salted chain from the pool's internal key). Without namespaces (a test's node) the
  store is a deployment's.

Imports nothing of ``prfaas.pool`` (``serve/`` is below it): the pool's figures come in as
arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prfaas.config import DeploymentConfig
from prfaas.core import SiteId
from prfaas.core.ids import link_id_for
from prfaas.serve.node.host import WorkerHost
from prfaas.serve.node.hosting import LinkRateRefused
from prfaas.serve.node.messages import (
    PrefillCommand,
    PrefixNamespaceMsg,
    unpack_tokens,
)
from prfaas.serve.node.prefix_namespaces import PrefixNamespaces
from prfaas.transfer.link_pool import KeyTLS


class PoolNodeHost(WorkerHost):
    paces_site_link = False

    def __init__(
        self,
        deployment: DeploymentConfig,
        node_names: Sequence[str],
        control_url: str,
        pool_egress_gbps: float,
        host: str = "127.0.0.1",
        process_name: str = "",
        link_keys: Mapping[str, bytes] | None = None,
        link_tls: Mapping[str, KeyTLS] | None = None,
        prefix_namespaces: PrefixNamespaces | None = None,
    ) -> None:
        """``pool_egress_gbps``: the pool's total egress (modelled Gbps), the cap over every
        tenant's route; ``link_keys``, ``link_tls``: every tenant's keys and the TLS of its
        receivers (``WorkerHost``); ``prefix_namespaces``: each tenant's prefixes in a namespace
        of its own, under its quota (``serve/node/prefix_namespaces.py``)."""
        # Read by ``egress_cap_bytes_per_s`` while the base builds the link pool.
        self.pool_egress_gbps = pool_egress_gbps
        self._tenant_gbps: dict[str, float | None] = {}
        """Tenant routes -> the rate each is set at now (modelled Gbps; None: unpaced by the
        tenant): a route is set again only when its tenant's rate changes (a re-set route is
        estimated afresh)."""
        super().__init__(
            deployment, node_names, control_url, host, process_name, link_keys, link_tls
        )
        self.prefix_namespaces: PrefixNamespaces | None = None
        if prefix_namespaces is not None:
            self.set_prefix_namespaces(prefix_namespaces)

    # -- per-tenant routes ---------------------------------------------------------------------
    def egress_cap_bytes_per_s(self) -> float | None:
        """The egress cap in wall payload bytes/s: the pool's ``egress_gbps``, shared by every
        tenant's route (None under ``netns: true``, where nothing here paces)."""
        if self.deployment.netns:
            return None
        return self._wall_rate(self.pool_egress_gbps)

    def tenant_route(self, tenant: str, gbps: float | None) -> str:
        """The route a tenant's KV takes from this site (``"{site}->{tenant}"``), set (or
        re-set, when its rate changed) to pace at the tenant's own link rate ``gbps`` (modelled;
        None: unpaced by it, so only the egress cap applies, and not estimated: no rate is
        known to estimate it from). Under ``netns: true`` nothing paces it."""
        route = link_id_for(SiteId(self.site.name), SiteId(tenant))
        if route in self._tenant_gbps and self._tenant_gbps[route] == gbps:
            return route
        self._tenant_gbps[route] = gbps
        configured = None if gbps is None else self._wall_rate(gbps)
        pace = None if self.deployment.netns else configured
        self.links.set_route(route, pace, configured)
        return route

    def route_of(self, cmd: PrefillCommand) -> str | None:
        """The route ``cmd``'s KV takes: its tenant's own (``tenant_route``) when it names one
        and crosses sites, else None (the site's one link, or within the site)."""
        if not (cmd.tenant and cmd.cross_site):
            return None
        return self.tenant_route(cmd.tenant, cmd.tenant_link_gbps)

    def _refuse_link_rate(self) -> None:
        super()._refuse_link_rate()
        raise LinkRateRefused(
            f"site {self.site.name} is a PrfaaS pool's node group: its egress is the pool "
            "file's egress_gbps and each tenant's link is the rate that tenant registered"
        )

    # -- per-tenant prefix namespaces ----------------------------------------------------------
    def set_prefix_namespaces(self, namespaces: PrefixNamespaces) -> None:
        """The tenants' namespaces and quotas (at start, and on a reload of the tenants: nothing
        is evicted now; a namespace left over its quota, or without one, loses entries first)."""
        self.prefix_namespaces = namespaces
        self.prefix_store.set_quotas(namespaces.quotas(self.prefix_store.capacity_bytes))

    def _in_namespace(self, cmd: PrefillCommand) -> tuple[PrefillCommand, str]:
        """The prefill with its prompt's chain in its tenant's namespace (computed here from the
        tokens: a caller's hashes are never taken), and that namespace."""
        ns = self.prefix_namespaces
        if ns is None:
            return super()._in_namespace(cmd)
        hashes: list[int] = []
        if cmd.tenant:  # a command naming no tenant has no namespace: it neither hits nor stores
            tokens = unpack_tokens(cmd.tokens)
            hashes = list(ns.chain(cmd.tenant, tokens, self.prefix_store.block_tokens))
        return cmd.model_copy(update={"block_hashes": hashes}), ns.namespace_of(cmd.tenant)

    def _namespace_reports(self) -> list[PrefixNamespaceMsg]:
        return [] if self.prefix_namespaces is None else self.namespace_reports()

    def namespace_reports(self) -> list[PrefixNamespaceMsg]:
        """The prefix store per namespace, its bytes in modelled units (like the link reports)."""
        scale = self.deployment.engine_for(self.site.name).real_bytes_per_payload_byte
        return [
            PrefixNamespaceMsg(
                namespace=u.namespace,
                num_entries=u.num_entries,
                num_tokens=u.num_tokens,
                used_bytes=int(u.used_bytes * scale),
                quota_bytes=int(u.quota_bytes * scale),
                hit_tokens=u.num_hit_tokens,
                lookup_tokens=u.num_lookup_tokens,
            )
            for u in self.prefix_store.usage()
        ]
