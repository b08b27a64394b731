"""``summary(sim)``: the one JSON-ready object a run produces (schema in docs/simulation.md).

Deterministic: built only from simulated quantities (never wall time), keys in a fixed order,
floats rounded to 9 significant digits. Pure.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prfaas.core.topology import SiteKind
from prfaas.sim.metrics import dist, r
from prfaas.sim.nodes import DecodeNode, PrefillNode
from prfaas.sim.simulator import Simulator

SCHEMA = "prfaas.sim/1"


def _scenario(sim: Simulator) -> dict[str, Any]:
    sc = sim.sc
    out = asdict(sc)
    out["arrival"] = asdict(sc.arrival)
    return out


def throughput_span_s(sim: Simulator) -> float:
    """What ``throughput_rps`` divides by. Synthetic arrivals: the arrival window after the
    warm-up (``duration_s - warmup_s``). A trace replay: the span it replayed, from the warm-up
    to the later of its last arrival and its last completion (not ``duration_s``, which may run
    far past the trace's end: 90 requests replayed in 28 s are ~3 req/s, not 90 / 600)."""
    sc, m = sim.world.sc, sim.world.metrics
    if sc.trace is None:
        return sc.duration_s - sc.warmup_s
    return max(m.last_arrival_s, m.last_finish_s) - sc.warmup_s


def summary(sim: Simulator) -> dict[str, Any]:
    w = sim.world
    m = w.metrics
    end = max(m.last_finish_s, 1e-9)
    span = throughput_span_s(sim)
    sites: dict[str, Any] = {}
    for i, sid in enumerate(w.site_ids):
        nodes = [n for n in w.nodes if n.site == i]
        pre = [n for n in nodes if isinstance(n, PrefillNode)]
        dec = [n for n in nodes if isinstance(n, DecodeNode)]
        cache = w.kv.cache(sid)
        sites[sid] = {
            "kind": w.site_kinds[i].value,
            "num_prefill_nodes": len(pre),
            "num_decode_nodes": len(dec),
            "requests_prefilled": w.site_prefilled[i],
            "prefill_utilisation": r(sum(n.busy_s for n in pre) / (len(pre) * end)) if pre else 0.0,
            "decode_utilisation": r(sum(n.busy_s for n in dec) / (len(dec) * end)) if dec else 0.0,
            "decode_slot_utilisation": r(
                sum(n.slot_s for n in dec) / (sum(n.max_batch for n in dec) * end)
            )
            if dec
            else 0.0,
            "peak_prefill_queue": w.peak_queued[i],
            "peak_decode_waiting": w.peak_waiting[i] if w.site_kinds[i] is SiteKind.PD else 0,
            "prefix_hit_rate": r(cache.hit_rate),
            "prefix_cache_used_bytes": cache.used_bytes,
            "prefix_cache_evictions": cache.num_evictions,
        }
    links: dict[str, Any] = {}
    for link in w.links.values():
        moved = link.bytes_delivered(w.now)
        links[link.link_id] = {
            "bytes_moved": round(moved),
            "mean_gbps": r(moved * 8 / 1e9 / end),
            "mean_utilisation": r(moved / (link.nominal_capacity * end))
            if link.nominal_capacity > 0
            else 0.0,
            "peak_backlog_bytes": int(link.peak_backlog_bytes),
            "num_transfers": link.num_flows_done,
        }
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "requests": {
            "arrived": m.num_arrived,
            "completed": m.num_completed,
            "counted": m.num_counted,
            "failed": m.num_failed,
            "unfinished": m.num_arrived - m.num_completed - m.num_failed,
            "offloaded": m.num_offloaded,
            "rerouted": m.num_rerouted,
            "cache_moves": m.num_cache_moves,
        },
        "throughput_rps": r(m.num_counted / span) if span > 0 else 0.0,
        "throughput_span_s": r(span),
        "goodput_rps": r(m.num_good / span) if span > 0 else 0.0,
        "output_tokens_per_s": r(m.output_tokens / end),
        "prompt_tokens_per_s": r(m.prompt_tokens / end),
        "ttft_s": dist(m.ttft_s),
        "tpot_s": dist(m.tpot_s),
        "e2e_s": dist(m.e2e_s),
        "sites": sites,
        "links": links,
        "threshold_updates": m.threshold_updates,
        "role_changes": m.role_changes,
        "num_events": sim.num_events,
        "simulated_s": r(w.now),
        "scenario": _scenario(sim),
    }
    if m.samples_t:
        out["timeseries"] = {"t_s": m.samples_t, **m.series}
    return out
