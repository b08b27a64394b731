"""The pool's Prometheus metrics (``GET /metrics`` on the operator's listener).

Per tenant: its prefills by outcome (handed back by a noticed node among them), its charge
corrections (a done prefill whose node found more or less of its prompt than expected: refunded
or surcharged the difference), queued tokens,
running prefills, expected queueing, entitled and attainable shares, whether it is revoked, and
per group what the nodes' prefix stores hold for it (entries, bytes, quota, tokens found and
looked up: ``pool.tenant_prefixes``); per node group: its nodes by state; the front door's epoch
and key reloads. Everything is read from the placement driver and its front door when Prometheus
scrapes (a custom collector), so nothing is counted twice and a restarted door starts from zero
under a new epoch, as counters should.

Why the operator's listener, unsigned: Prometheus cannot sign, and per-tenant figures are the
operator's, not a tenant's - tenants' keys do not open this listener (a tenant reads its own
figures through the signed tenant API's feedback), and the rendered NetworkPolicy keeps its port to
the pool's namespace and monitoring. Like ``/health``, it carries counts, never keys or tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prfaas.pool.driver import PlacementDriver

OUTCOMES = ("accepted", "placed", "done", "failed", "aborted", "handed_back")
"""The driver's per-tenant counters, in the order a prefill meets them (``handed_back``: each
time a noticed node gave one back: queued again and placed again, or failed after too many)."""
CORRECTIONS = ("refunded", "surcharged")
"""The driver's per-tenant counts of charge true-ups at a done outcome, by direction (the node
found more of the prompt than the placement expected: refunded; less: surcharged)."""


class PoolCollector(Collector):
    def __init__(self, driver: PlacementDriver, key_reloads: Callable[[], int]) -> None:
        self.driver = driver
        self.key_reloads = key_reloads

    def collect(self) -> Iterator[Metric]:
        driver = self.driver
        door = driver.door
        now = driver.clock()
        prefills = CounterMetricFamily(
            "prfaas_pool_tenant_prefills",
            "Prefills of a tenant by what happened to them, since the front door started",
            labels=["tenant", "outcome"],
        )
        corrections = CounterMetricFamily(
            "prfaas_pool_tenant_charge_corrections",
            "Done prefills of a tenant whose fair-share charge was trued up to what their node "
            "really computed (it found more of the prompt: refunded; less: surcharged)",
            labels=["tenant", "direction"],
        )
        gauges = {
            name: GaugeMetricFamily(f"prfaas_pool_tenant_{name}", text, labels=["tenant"])
            for name, text in (
                ("queued_tokens", "Uncached prompt tokens of a tenant's queued prefills"),
                ("running", "A tenant's prefills running on pool nodes"),
                ("expected_queueing_seconds", "How long a prefill submitted now would wait "
                 "before it starts (modelled seconds; the worst group)"),
                ("entitled_share", "weight / the weights of the tenants active now"),
                ("attainable_share", "The pool share the tenant would get if it offered more"),
                ("revoked", "1 when the tenant's keys were withdrawn by a reload"),
            )
        }  # fmt: skip
        for tenant, counts in sorted(driver.counters.items()):
            for outcome in OUTCOMES:
                prefills.add_metric([tenant, outcome], counts[outcome])
            for direction in CORRECTIONS:
                corrections.add_metric([tenant, direction], counts[direction])
            fb = door.feedback(tenant, now)
            values = {
                "queued_tokens": fb.queued_tokens,
                "running": fb.running,
                "expected_queueing_seconds": fb.expected_queueing_s,
                "entitled_share": fb.entitled_share,
                "attainable_share": fb.attainable_share,
                "revoked": float(door.revoked(tenant)),
            }
            for name, value in values.items():
                gauges[name].add_metric([tenant], value)
        yield prefills
        yield corrections
        yield from gauges.values()
        yield from self._prefixes()
        nodes = GaugeMetricFamily(
            "prfaas_pool_nodes",
            "Pool nodes by group and state (busy: computing a prefill; free: live, taking work)",
            labels=["group", "state"],
        )
        by_group: dict[str, dict[str, int]] = {
            g: dict.fromkeys(("busy", "free", "draining", "faulted", "silent"), 0)
            for g in sorted(set(driver.node_groups.values()))
        }
        for name, n in driver.nodes.items():
            if n.fault:
                state = "faulted"
            elif not driver.live(name):
                state = "silent"
            elif name in driver.busy:
                state = "busy"
            elif n.draining:
                state = "draining"
            else:
                state = "free"
            by_group[n.group][state] += 1
        for group, states in by_group.items():
            for state, count in states.items():
                nodes.add_metric([group, state], count)
        yield nodes
        epoch = GaugeMetricFamily("prfaas_pool_epoch", "The front door's epoch")
        epoch.add_metric([], door.epoch)
        yield epoch
        reloads = CounterMetricFamily(
            "prfaas_pool_key_reloads", "Reloads of the tenant key list (SIGHUP, prfaas reload)"
        )
        reloads.add_metric([], self.key_reloads())
        yield reloads

    def _prefixes(self) -> Iterator[Metric]:
        """Each tenant's namespace per group (the shared one under ``share_prefixes: true``,
        then the same figures under every tenant)."""
        labels = ["tenant", "group"]
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "entries": GaugeMetricFamily(
                "prfaas_pool_tenant_prefix_entries",
                "Prefix checkpoints the group's live nodes hold for the tenant",
                labels=labels,
            ),
            "bytes": GaugeMetricFamily(
                "prfaas_pool_tenant_prefix_bytes", "Modelled bytes of them", labels=labels
            ),
            "quota_bytes": GaugeMetricFamily(
                "prfaas_pool_tenant_prefix_quota_bytes",
                "Modelled bytes of prefix store guaranteed to the tenant",
                labels=labels,
            ),
            "hit_tokens": CounterMetricFamily(
                "prfaas_pool_tenant_prefix_hit_tokens",
                "Prompt tokens found in the tenant's prefixes, not computed again (since the "
                "node processes started)",
                labels=labels,
            ),
            "lookup_tokens": CounterMetricFamily(
                "prfaas_pool_tenant_prefix_lookup_tokens",
                "Prompt tokens looked up in the tenant's prefixes",
                labels=labels,
            ),
        }
        for tenant in sorted(self.driver.counters):
            for g in self.driver.tenant_prefixes(tenant):
                row = g.to_json()
                for name, family in families.items():
                    family.add_metric([tenant, g.group], row[name])
        yield from families.values()


def pool_registry(driver: PlacementDriver, key_reloads: Callable[[], int]) -> CollectorRegistry:
    """A registry of the pool's own (not the process default: a test may build several doors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolCollector(driver, key_reloads))
    return registry
