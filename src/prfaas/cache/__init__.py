"""cache: the hybrid prefix cache as a data structure, the simulator's global KV manager over
it, and the live gateway's mirror of the nodes' prefix-store reports (``mirror``).

Pure: no torch, no asyncio, no clock reads, no I/O. Imports ``core`` and ``spec`` only.
"""

from prfaas.cache.kv_manager import GlobalKVManager
from prfaas.cache.mirror import KVMirror, StoreJournal
from prfaas.cache.prefix_cache import CacheSizing, HybridPrefixCache, sizing_for

__all__ = [
    "CacheSizing",
    "GlobalKVManager",
    "HybridPrefixCache",
    "KVMirror",
    "StoreJournal",
    "sizing_for",
]
