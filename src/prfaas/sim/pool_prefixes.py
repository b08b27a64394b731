"""``PoolPrefixes``: the simulated pool's prefix stores, as a live pool's nodes keep them
(``docs/pool.md``, *Prefixes* and *The simulator*).

A ``cache.CheckpointStore`` per node process (the live node's store's own code: LRU by bytes,
a namespace per tenant under its quota, eviction inside an over-quota namespace first): one per
node of a ``per_node_stores`` group, else one the group's nodes share; a timed node process's size
(``PoolSimGroup.store_bytes``); namespaces and quotas by ``cache.prefix_quotas``, the live rules
(``share_prefixes``: one namespace, the whole store). It is the placement's ``PlacementHints``
(``policy.pool_placement.dispatch_cached``, the live front door's placement): a prefill's
expected hit on a node is read from the node's store itself (live: from the door's mirror of the
node's reports, a heartbeat behind), its compute there ``prefill_node_s`` of the prompt past the
hit (the live driver's price). The node's own lookup when the prefill starts refreshes its LRU;
its checkpoints land in that store when its KV has all left (live: once the receiver verified
it, an RTT later), those past the prefix it found, every ``checkpoint_every_blocks`` blocks and
at its last full block (what the live timed engine checkpoints and the store keeps).

A prompt's blocks are its block hashes (a trace's ``hash_ids``): equal prompts of two tenants
have equal hashes, and the store keeps each tenant's namespace apart, as the live salts and
namespaces together do. A prompt without hashes is looked up (its tokens counted) and never hits
or stores. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from prfaas.cache.checkpoint_store import Checkpoint, CheckpointStore
from prfaas.cache.prefix_quotas import namespace_of, namespace_quotas
from prfaas.perf import CostModel
from prfaas.policy.pool_admission import PrefillJob, prefill_node_s
from prfaas.sim.pool_scenario import PoolSimGroup, PoolSimScenario

Store = CheckpointStore[Checkpoint]


class Prompt(Protocol):
    """What the stores read of a pool prefill's request (``sim.pool_tenant_run.PoolRequest``)."""

    @property
    def num_tokens(self) -> int: ...
    @property
    def block_hashes(self) -> tuple[int, ...]: ...


class PoolPrefixes:
    def __init__(
        self,
        sc: PoolSimScenario,
        kv_bytes: Mapping[str, Callable[[int], int]],
        node_cost: Mapping[str, CostModel],
        pending: Mapping[tuple[str, str], Prompt],
    ) -> None:
        """``kv_bytes``: model -> a checkpoint's bytes for its tokens (``S_kv``); ``node_cost``:
        model -> what the group's nodes are charged with (``prefill_node_s``); ``pending``: the
        simulator's accepted prefills not yet started, (tenant, request id) -> request."""
        self.sc = sc
        self._kv_bytes = kv_bytes
        self._node_cost = node_cost
        self._pending = pending
        self._groups = {g.name: g for g in sc.groups}
        self._group_of_model = {g.model: g.name for g in sc.groups}
        self._stores: dict[str, dict[str, Store]] = {}
        for g in sc.groups:
            one = None if g.per_node_stores else self._new_store(g)
            self._stores[g.name] = {n: self._new_store(g) if one is None else one for n in g.nodes}

    def _new_store(self, g: PoolSimGroup) -> Store:
        """An empty store for a node process of ``g``, its quotas the tenants'."""
        capacity = g.store_bytes
        quotas = namespace_quotas(self.sc.shares, self.sc.share_prefixes, capacity)
        return CheckpointStore(capacity, self.sc.block_tokens, g.checkpoint_every_blocks, quotas)

    def node_stores(self, group: str) -> dict[str, Store]:
        """Node -> its store (the nodes of one process share one)."""
        return dict(self._stores[group])

    def namespace(self, tenant: str) -> str:
        return namespace_of(tenant, self.sc.share_prefixes)

    # -- the placement's hints (``policy.PlacementHints``) ---------------------------------------
    def hit_tokens(self, job: PrefillJob, node: str) -> int:
        req = self._pending.get((job.tenant, job.request_id))
        if req is None or not req.block_hashes:
            return 0
        store = self._stores[self._group_of_model[job.model]][node]
        return store.cached_tokens(req.block_hashes, req.num_tokens, self.namespace(job.tenant))

    def compute_s(self, job: PrefillJob, cached_tokens: int) -> float:
        if cached_tokens <= 0:
            return job.compute_s  # the submitted price: ``prefill_node_s`` of the whole prompt
        # The whole prompt is the job's (the tenant's own prefix cache is not modelled).
        num_new = max(1, job.num_uncached_tokens - cached_tokens)
        return prefill_node_s(self._node_cost[job.model], num_new, cached_tokens)

    # -- the nodes -------------------------------------------------------------------------------
    def looked_up(self, group: str, node: str, tenant: str, req: Prompt) -> tuple[Store, int]:
        """The node's own lookup as the prefill starts there (refreshes its LRU, counts it): its
        store and the prompt tokens found."""
        store = self._stores[group][node]
        n = req.num_tokens
        hit = store.lookup(req.block_hashes, n, n - 1, self.namespace(tenant))
        return store, 0 if hit is None else hit.num_tokens

    def stored(self, group: str, store: Store, tenant: str, req: Prompt, cached: int) -> None:
        """A prefill's KV has all left its node, whose ``store`` found ``cached`` tokens: the
        checkpoints past them go in (only those the store keeps are made: its choice from the
        engine's every-block list is the same)."""
        if not req.block_hashes or all(s is not store for s in self._stores[group].values()):
            return  # nothing to key on, or its node was lost since (another store now)
        block = store.block_tokens
        last = min(req.num_tokens // block, len(req.block_hashes))
        every = store.checkpoint_every_blocks
        kv = self._kv_bytes[self._groups[group].model]
        ks = [k for k in range(cached // block + 1, last + 1) if k % every == 0 or k == last]
        points = [Checkpoint(k * block, kv(k * block)) for k in ks]
        store.insert(req.block_hashes, points, self.namespace(tenant))

    def node_lost(self, group: str, node: str) -> None:
        """``node`` was lost: a process of its own comes back with an empty store (a shared
        process's store stays: its other nodes still run)."""
        g = self._groups[group]
        if g.per_node_stores:
            self._stores[group][node] = self._new_store(g)
