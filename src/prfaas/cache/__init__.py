"""cache: the hybrid prefix cache as a data structure, and the global KV manager's view of it.

Pure: no torch, no asyncio, no clock reads, no I/O. Imports ``core`` and ``spec`` only.
"""

from prfaas.cache.kv_manager import GlobalKVManager
from prfaas.cache.prefix_cache import CacheSizing, HybridPrefixCache, sizing_for

__all__ = ["CacheSizing", "GlobalKVManager", "HybridPrefixCache", "sizing_for"]
