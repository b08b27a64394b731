"""``OutcomeBook``: what the gateway learns when a prefill finishes, in one place: what the
prefill left in its process's prefix store (a pending entry in the ``KVMirror``, until that
store's reports cover it), the prefix hit-rate and cross-site byte metrics, and the bounded route
log (``RouteRecord`` per request, newest last) that ``/internal/routes``, ``prfaas status`` and the
demo's live-vs-sim comparison read. No I/O.

The gateway models no store: the pending entry is exactly what the node said it stored (the
outcome's ``stored_prefixes``), kept only because the next heartbeat may be an interval away and
a follow-up request sent before it would otherwise miss the prefix.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

from prfaas.cache.mirror import KVMirror
from prfaas.core import SiteId
from prfaas.policy.decisions import RouteDecision
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.gateway.hashing import prompt_digest
from prfaas.serve.node.messages import PrefillOutcome


@dataclass(frozen=True, slots=True)
class RouteRecord:
    """What happened to one request (for the demo's report and the sim comparison)."""

    request_id: str
    prefill_site: str
    prefill_node: str
    decode_node: str
    offloaded: bool
    num_prompt_tokens: int
    num_cached_tokens: int
    kv_bytes: int
    attempts: int
    moved_tokens: int = 0
    """Prefix tokens moved across sites before the prefill (the router's ``CacheMove``)."""
    prompt_digest: str = ""
    """Hash of the prompt's token ids: lets a load generator match records to its requests."""
    kv_recomputed: bool = False
    """The decode node could not use the KV sent to it and recomputed the prompt (a vLLM
    server's failed load): ``kv_bytes`` crossed but were wasted; the route did not work as one."""


class OutcomeBook:
    def __init__(
        self,
        kv: KVMirror,
        metrics: GatewayMetrics,
        home: SiteId,
        byte_divisors: Mapping[str, int],
        route_log_size: int,
    ) -> None:
        self.kv = kv
        self.metrics = metrics
        self.home = home
        self.byte_divisors = byte_divisors
        """Real KV bytes per payload byte, per site (each site's own engine)."""
        self.records: deque[RouteRecord] = deque(maxlen=route_log_size)
        """The newest ``route_log_size`` requests' routes; older ones are dropped."""
        self._prefix_counts: dict[str, tuple[int, int]] = {}
        """Per site: (prompt tokens looked up, tokens found cached), since start."""

    def prefill_done(
        self,
        request_id: str,
        prompt_token_ids: tuple[int, ...],
        hashes: tuple[int, ...],
        decision: RouteDecision,
        decode_node: str,
        outcome: PrefillOutcome,
        attempt: int,
        moved_tokens: int,
        store_id: str | None = None,
        now_s: float = 0.0,
    ) -> None:
        """A prefill succeeded: its process's store (``store_id``) holds what the outcome says it
        stored, and the request's route is logged."""
        n = len(prompt_token_ids)
        site = decision.prefill_site
        if store_id is not None and outcome.stored_prefixes:
            self.kv.expect_stored(
                store_id, outcome.stored_prefixes, now_s, outcome.store_epoch, outcome.store_seq
            )
        self.metrics.observe_prefix_lookup(site, n, outcome.num_cached_tokens)
        looked, hit = self._prefix_counts.get(site, (0, 0))
        looked, hit = looked + n, hit + outcome.num_cached_tokens
        self._prefix_counts[site] = (looked, hit)
        self.metrics.prefix_hit_rate.labels(site=site).set(hit / looked)
        kv_bytes = outcome.kv_bytes_sent * self.byte_divisors.get(site, 1)
        if decision.offloaded:
            self.metrics.cross_site_bytes.labels(src_site=site, dst_site=self.home).inc(kv_bytes)
        self.records.append(
            RouteRecord(
                request_id, site, decision.prefill_node, decode_node, decision.offloaded, n,
                outcome.num_cached_tokens, kv_bytes, attempt, moved_tokens,
                prompt_digest(prompt_token_ids),
            )
        )  # fmt: skip

    def decode_recomputed(self, request_id: str, decode_node: str) -> None:
        """``request_id``'s decode node recomputed its prompt instead of using the KV sent to it:
        counted, and its route record (if still logged) says so."""
        self.metrics.kv_recomputed.labels(decode_node=decode_node).inc()
        for i in range(len(self.records) - 1, -1, -1):  # newest last: it is near the end
            if self.records[i].request_id == request_id:
                self.records[i] = replace(self.records[i], kv_recomputed=True)
                return
