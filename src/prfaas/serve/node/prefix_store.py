"""A site's store of prefix checkpoints: the payloads behind the hybrid prefix cache, and the one
truth about what a node of this process will find.

An entry is the engine's ``CachedPrefix`` as of k blocks, keyed by the prompt's k-th block hash
(``serve/gateway/hashing.py``'s chain), LRU by bytes, in namespaces with quotas (a PrfaaS pool's
node keeps each tenant's entries in a namespace of its own, its chains salted per tenant,
``prefix_namespaces.py``). Those rules are ``cache/checkpoint_store.py``'s ``CheckpointStore``,
the pool simulator's nodes' store too; this module adds what only a live process has: the payloads
and the journal. One store per worker process, shared by the process's nodes of one site.

Every insert and eviction goes into the store's ``StoreJournal`` (``cache/mirror.py``): the
process's heartbeats carry those changes to the gateway, whose ``KVMirror`` routes from them (a
pool node's go to its front door, which mirrors them to place prefills where their prefixes are,
``pool.prefix_hits``, beside ``usage`` per namespace).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

from prfaas.cache.checkpoint_store import CheckpointStore, NamespaceUsage
from prfaas.cache.mirror import MAX_CHANGES_PER_REPORT, ReportAck, StoreJournal, StoreReport
from prfaas.engine import CachedPrefix

__all__ = ["NamespaceUsage", "PrefixStore"]


class PrefixStore(CheckpointStore[CachedPrefix]):
    def __init__(
        self,
        capacity_bytes: int,
        block_tokens: int,
        checkpoint_every_blocks: int = 1,
        max_changes_per_report: int = MAX_CHANGES_PER_REPORT,
        quotas: Mapping[str, int] | None = None,
    ) -> None:
        """``quotas``: namespace -> bytes guaranteed to it (a pool node's tenants; a namespace
        not listed is guaranteed nothing); None: one namespace, ``""``, of the whole store."""
        # A fresh epoch per store lifetime: a restarted process's sequence numbers start again,
        # and the gateway must not take them for ones it has applied.
        self.journal = StoreJournal(secrets.randbits(62), max_changes_per_report)
        super().__init__(
            capacity_bytes, block_tokens, checkpoint_every_blocks, quotas, changes=self.journal
        )
        self.journal.snapshot(())  # the gateway starts from an empty store

    def insert(
        self,
        block_hashes: Sequence[int],
        checkpoints: Sequence[CachedPrefix],
        namespace: str = "",
    ) -> list[tuple[int, int]]:
        """``CheckpointStore.insert``, its changes journaled (a snapshot instead when the journal
        outgrew one)."""
        kept = super().insert(block_hashes, checkpoints, namespace)
        self._bound_journal()
        return kept

    # -- reports to the gateway -------------------------------------------------------------------
    def report(self) -> StoreReport:
        """The next changes for the gateway (none: it has them all; still sent, see
        ``StoreJournal.report``)."""
        return self.journal.report()

    def acknowledge(self, ack: ReportAck) -> None:
        """The gateway's answer to a report: forget what it applied; snapshot if it asks."""
        if self.journal.acknowledge(ack):
            self.snapshot()

    def snapshot(self) -> None:
        """Send the whole store next (a gateway that forgot it, or missed changes)."""
        self.journal.snapshot(self.entries())

    def _bound_journal(self) -> None:
        if self.journal.outgrown(len(self)):
            self.snapshot()

    @property
    def seq(self) -> int:
        """The journal's sequence number after the last change (a prefill outcome carries it)."""
        return self.journal.seq

    @property
    def epoch(self) -> int:
        return self.journal.epoch
