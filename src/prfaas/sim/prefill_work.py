"""What a request's prefill costs on its node: its service time alone (``service_s``), and the
prefix its node finds cached when the prefill starts (``found_since_routed``, a vLLM site's
servers look up their cache then).

Pure: no I/O, no clock; imports only the simulator's own types and the cache.
"""

from __future__ import annotations

from prfaas.cache import HybridPrefixCache
from prfaas.sim.nodes import PrefillNode
from prfaas.sim.request import SimRequest


def service_s(req: SimRequest, node: PrefillNode) -> float:
    """``req``'s prefill on ``node`` alone: its uncached tokens after its cached prefix, and the
    node process's costs around the passes (per request, per uncached token, the passes' own
    in-service excess over the curve)."""
    uncached = req.num_prompt - req.num_cached
    passes_s = node.cm.prefill_s(uncached, req.num_cached)
    return passes_s + node.cm.plumbing.prefill_overhead_s(uncached, passes_s)


def found_since_routed(batch: list[SimRequest], node: PrefillNode, cache: HybridPrefixCache) -> int:
    """The prefix tokens ``batch``'s members find in ``cache`` (their site's) as their prefill
    starts beyond what they found when routed, at a site whose engine looks its cache up when it
    schedules a prompt (``SimSite.lookup_at_start``: vLLM): a turn queued behind its session's
    previous turn reuses what that prefill has stored since (in a 90-request burst of
    multi-turn sessions a vLLM server did 1.7x less prefill work than routing-time hits gave,
    2026-12-06). Their cached counts and work are updated, the hits counted in the cache's hit
    rate; the tokens no longer computed are returned."""
    gained = 0
    for req in batch:
        hashes = req.block_hashes
        if not hashes or not cache.may_extend(hashes, req.num_cached):
            continue  # most requests (hot path): nothing stored past what they found
        found = cache.cached_tokens(hashes, req.num_prompt - 1)
        if found > req.num_cached:
            cache.num_hit_tokens += found - req.num_cached
            gained += found - req.num_cached
            req.num_cached = found
            req.work_s = service_s(req, node)
    return gained
