"""cache: the hybrid prefix cache as a data structure, the simulator's global KV manager over
it, the live gateway's mirror of the nodes' prefix-store reports (``mirror``), and a node
process's store of prefix checkpoints in namespaces with quotas (``checkpoint_store``, with
``prefix_quotas``' rules: the live node's store and the pool simulator's).

Pure: no torch, no asyncio, no clock reads, no I/O. Imports ``core`` and ``spec`` only.
"""

from prfaas.cache.checkpoint_store import Checkpoint, CheckpointStore
from prfaas.cache.kv_manager import GlobalKVManager
from prfaas.cache.mirror import KVMirror, StoreJournal
from prfaas.cache.prefix_cache import CacheSizing, HybridPrefixCache, sizing_for

__all__ = [
    "CacheSizing",
    "Checkpoint",
    "CheckpointStore",
    "GlobalKVManager",
    "HybridPrefixCache",
    "KVMirror",
    "StoreJournal",
    "sizing_for",
]
