"""The pool as a tenant's gateway sees it: one PrfaaS site of one prefill node, linked to the
tenant's home site by the tenant's own link (``docs/pool.md``). ``with_pool_site`` is what the
live gateway builds its registry, router and cost models from, and what ``prfaas sim POOL
TENANT...`` gives each tenant's router its cost models from (``commands/sim_pool.py``): kept out
of ``pool.tenant`` (the lease's I/O) so the simulator's command does not import it. No I/O.
"""

from __future__ import annotations

from prfaas.config import DeploymentConfig, NodeConfig, SiteConfig
from prfaas.core.link_config import LinkConfig
from prfaas.policy.pool_tenant_route import POOL_NODE, POOL_SITE

POOL_SITE_HARDWARE = "h200"
"""The tenant file does not say the pool's hardware: its router's remote cost model assumes an
H200 node (the example pool's groups)."""


def with_pool_site(d: DeploymentConfig) -> DeploymentConfig:
    """The tenant's deployment as its gateway sees it: the pool as a PrfaaS site of one node,
    linked to the home site by the tenant's own link (not validated again: a tenant file has no
    PrfaaS site of its own, which this adds)."""
    assert d.pool is not None
    site = SiteConfig(
        name=POOL_SITE,
        kind="prfaas",
        hardware=POOL_SITE_HARDWARE,
        nodes=[NodeConfig(name=POOL_NODE, role="prefill")],
    )
    link = LinkConfig(
        src=POOL_SITE, dst=d.home_site.name, gbps=d.pool.link.gbps, rtt_ms=d.pool.link.rtt_ms
    )
    return d.model_copy(update={"sites": [*d.sites, site], "links": [*d.links, link]})
