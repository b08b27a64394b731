"""The pool simulator's JSON: the pool (per group and egress utilisation over the measurement
window) and a ``tenants`` object, one entry per tenant (counts, keeps by reason, refusals by
reason, TTFT, its shares of each group's compute and of the egress, its dominant share, its
thresholds, what its pool prefills found of its prefixes at their nodes); per group, its nodes'
prefix stores at the end of the run.
Schema ``prfaas.sim.pool/1`` (``docs/pool.md``). Pure.
"""

from __future__ import annotations

from typing import Any

from prfaas.sim.pool_sim import PoolSimulator


def _r(x: float) -> float:
    return float(f"{x:.9g}")


def _dist(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    s = sorted(xs)

    def q(p: float) -> float:  # nearest rank
        return s[min(len(s) - 1, max(0, int(-(-p * len(s) // 1)) - 1))]

    return {
        "mean": _r(sum(s) / len(s)),
        "p50": _r(q(0.5)),
        "p90": _r(q(0.9)),
        "p99": _r(q(0.99)),
        "max": _r(s[-1]),
    }


def _stores(sim: PoolSimulator, group: str) -> dict[str, Any]:
    """A group's prefix stores (one per node process) at the end: how many, each one's
    capacity, and the entries and bytes they hold together (modelled bytes)."""
    stores = list({id(s): s for s in sim.prefixes.node_stores(group).values()}.values())
    return {
        "num_stores": len(stores),
        "capacity_bytes": stores[0].capacity_bytes if stores else 0,
        "num_entries": sum(len(s) for s in stores),
        "used_bytes": sum(s.used_bytes for s in stores),
    }


def pool_summary(sim: PoolSimulator) -> dict[str, Any]:
    sc = sim.sc
    lo, hi = sc.measure_from_s, sc.window_end_s
    span = max(hi - lo, 1e-9)
    egress_cap = sc.shape.egress_bytes_per_s * span
    tenants: dict[str, Any] = {}
    for name, run in sim.tenants.items():
        spec = run.spec
        compute = {
            g.name: run.compute_s_in_window[g.name] / (g.num_nodes * span) for g in sc.groups
        }
        egress = sim.egress.sent_in_window[name] / egress_cap
        weight = next(t.weight for t in sc.shape.tenants if t.name == name)
        tenants[name] = {
            "model": spec.model,
            "weight": weight,
            "tuner": spec.tuner,
            "ttft_target_s": spec.ttft_target_s,
            "requests": {
                "arrived": run.num_arrived,
                "completed": run.num_completed,
                "unfinished": run.num_arrived - run.num_completed,
                "offloaded": run.num_offloaded,
                "local": run.num_local,
                "kept_local_by_feedback": run.num_kept_local_by_feedback,
                # By reason, as live (``prfaas_pool_kept_local_total{reason}``).
                "kept_local": {
                    "link": run.num_kept_local_for_link,
                    "expected_queueing": run.num_kept_local_by_feedback,
                },
                "refused": dict(sorted(run.refused.items())),
                "fallbacks": dict(sorted(run.session.fallbacks.items())),
            },
            "ttft_s": _dist(run.ttft_s),
            "fallback_ttft_s": _dist(run.fallback_ttft_s),
            "met_target": bool(run.ttft_s) and _dist(run.ttft_s)["mean"] <= spec.ttft_target_s,
            "compute_share": {g: _r(v) for g, v in compute.items()},
            "egress_share": _r(egress),
            "dominant_share": _r(max([egress, *compute.values()])),
            # Its pool prefills' prompts as their nodes looked them up in its namespace (the
            # live feedback's ``prefixes`` ``hit_tokens`` / ``lookup_tokens``), whole run.
            "pool_prefixes": {
                "hit_tokens": run.pool_hit_tokens,
                "lookup_tokens": run.pool_lookup_tokens,
                "hit_rate": _r(run.pool_hit_tokens / max(1, run.pool_lookup_tokens)),
            },
            "threshold_tokens": run.threshold_tokens,
            "threshold_updates": [
                {"t_s": _r(t), "threshold_tokens": v} for t, v in run.threshold_updates
            ],
        }
    groups = {
        g.name: {
            "model": g.model,
            "num_nodes": g.num_nodes,
            "utilisation": _r(
                sum(sim.tenants[t].compute_s_in_window[g.name] for t in sim.tenants)
                / (g.num_nodes * span)
            ),
            "prefix_stores": _stores(sim, g.name),
        }
        for g in sc.groups
    }
    return {
        "schema": "prfaas.sim.pool/1",
        "rule": "weighted dominant-resource fair queueing, VTC lifting, work-conserving",
        "window_s": {"from": _r(lo), "to": _r(hi)},
        "pool": {
            "groups": groups,
            "egress_gbps": _r(sc.shape.egress_bytes_per_s * 8 / 1e9),
            "egress_utilisation": _r(sum(sim.egress.sent_in_window.values()) / egress_cap),
            "refused": {k: v for k, v in sim.admission.num_refused.items() if v},
        },
        "tenants": tenants,
        "num_events": sim.num_events,
        "simulated_s": _r(sim.now),
    }
