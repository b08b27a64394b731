"""``GlobalKVManager``: for each request, the cached prefix length at every site.

It holds one ``HybridPrefixCache`` per site (site ids in a fixed order) and answers the router's
question without touching LRU order (``peek``), then commits what the chosen site used
(``use``) and what a finished prefill leaves behind (``store``). A cross-site cache move is a
``store`` at the destination of the moved prefix. Pure.

This is the simulator's manager: a simulated site's ``HybridPrefixCache`` *is* its store. The live
gateway models no cache; it mirrors what the nodes' stores report (``cache/mirror.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from prfaas.cache.prefix_cache import HybridPrefixCache
from prfaas.core.ids import SiteId


class GlobalKVManager:
    def __init__(self, caches: Mapping[SiteId, HybridPrefixCache]) -> None:
        self._caches = dict(caches)
        self._in_order = tuple(self._caches.items())
        # What ``peek`` calls per site, resolved once (it runs once per request).
        self._matchers = tuple(
            (site, cache.match_blocks, cache.sizing.block_tokens) for site, cache in self._in_order
        )

    @property
    def site_ids(self) -> tuple[SiteId, ...]:
        return tuple(site for site, _ in self._in_order)

    def cache(self, site_id: SiteId) -> HybridPrefixCache:
        return self._caches[site_id]

    def peek(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> Mapping[SiteId, int]:
        """Cached prefix tokens per site (sites with no hit omitted); no state change."""
        if not block_hashes:
            return MappingProxyType({})
        out: dict[SiteId, int] = {}
        limit = num_prompt_tokens - 1
        for site, match_blocks, block_tokens in self._matchers:
            k = match_blocks(block_hashes, limit)
            if k:
                out[site] = k * block_tokens
        return out

    def use(
        self,
        site_id: SiteId,
        block_hashes: Sequence[int],
        num_prompt_tokens: int,
        peeked_tokens: int | None = None,
    ) -> int:
        """Record a lookup at the prefill site; returns the prefix tokens it reuses.

        ``peeked_tokens``: that site's figure from a ``peek`` of this prompt with no cache update
        since (0 where the peek omitted the site); spares matching the prompt again.
        """
        if not block_hashes:
            cache = self._caches[site_id]
            cache.num_lookups += 1
            cache.num_lookup_tokens += num_prompt_tokens
            return 0
        return self._caches[site_id].lookup(block_hashes, num_prompt_tokens, peeked_tokens)

    def store(self, site_id: SiteId, block_hashes: Sequence[int], num_tokens: int) -> None:
        if block_hashes:
            self._caches[site_id].insert(block_hashes, num_tokens)

    def check_integrity(self) -> None:
        for cache in self._caches.values():
            cache.check_integrity()
