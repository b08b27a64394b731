"""What each pool node process's prefix store holds, as the front door can know it: the expected
pool hit of a queued prefill on each node (``docs/pool.md``, *Prefixes*).

The door can compute a prompt's chain in any tenant's namespace exactly as the nodes do: it holds
the pool's internal key the salts are drawn from (``serve/node/prefix_namespaces.py``
``PrefixNamespaces.from_internal_key``: the same salts on the door and every node) and the
prompt's tokens (the submit's ``Payload``). What it needs from the nodes is the set of prefixes
each store holds: a pool node's heartbeat carries its store's change journal (the same
``PrefixReportMsg`` a deployment's node sends its gateway), which ``PrefixHits`` mirrors per
process (``cache/mirror.py`` ``StoreMirror``, answered with an acknowledgement in the heartbeat's
answer) beside the per-namespace figures. A journal is namespace-blind, but each tenant's chain is
salted with its own secret salt, so a tenant's chain names only its own namespace's entries (or
the shared namespace's under ``share_prefixes: true``, where the chain is unsalted and the
namespace is everyone's). A done prefill's outcome says what its node stored
(``stored_prefixes``): kept as pending until the reports cover it, so a follow-up placed within a
heartbeat finds it.

The estimate is the node's ``PrefixStore.lookup`` over the mirror (whole blocks, leaving a token to
compute); the node's own lookup stays the truth (the outcome's ``cached_tokens``): an entry
evicted since its last report is a miss there. No I/O, no clock (``now_s`` passed in).
"""

from __future__ import annotations

from collections.abc import Callable

from prfaas.cache.mirror import ReportAck, StoreMirror
from prfaas.core.ids import SiteId
from prfaas.policy.pool_placement import reusable_tokens
from prfaas.serve.node.messages import PrefillOutcome, PrefixReportMsg, unpack_tokens
from prfaas.serve.node.prefix_namespaces import PrefixNamespaces

PENDING_TTL_S = 30.0
"""How long a prefix a done prefill stored counts before its process's reports cover it (wall
seconds; the reports normally do within a heartbeat)."""


class PrefixHits:
    def __init__(
        self,
        namespaces: PrefixNamespaces,
        block_tokens: int,
        compute_s: Callable[[str, int, int], float] | None = None,
    ) -> None:
        """``namespaces``: the salts (from the pool's internal key, as the nodes draw them);
        ``block_tokens``: the pool's block; ``compute_s(model, new tokens, cached tokens)``: a
        group's node-seconds for a prefill after a cached prefix (None: charges stay as
        submitted)."""
        self.namespaces = namespaces
        self.block_tokens = block_tokens
        self.compute_s = compute_s
        self.mirrors: dict[str, StoreMirror] = {}
        """process -> its store, as its reports say."""
        self._chains: dict[tuple[str, str], tuple[int, ...]] = {}
        """(tenant, request id) -> its prompt's chain in its tenant's namespace, until it ends."""

    # -- the nodes' reports --------------------------------------------------------------------
    def registered(self, process: str, group: str) -> None:
        """A process (re)registered: its store is mirrored afresh (it sends a snapshot)."""
        self.mirrors[process] = StoreMirror(SiteId(group))

    def report(self, process: str, msg: PrefixReportMsg) -> ReportAck | None:
        """Apply a heartbeat's journal; the acknowledgement for the heartbeat's answer (None: an
        unknown process)."""
        mirror = self.mirrors.get(process)
        return None if mirror is None else mirror.apply(msg.to_report())

    def stored(self, process: str, outcome: PrefillOutcome, now_s: float) -> None:
        """A done prefill's node stored these prefixes: count on them until the reports do."""
        mirror = self.mirrors.get(process)
        if mirror is not None and outcome.stored_prefixes:
            mirror.expect(outcome.stored_prefixes, now_s, PENDING_TTL_S,
                          outcome.store_epoch, outcome.store_seq)  # fmt: skip

    # -- the prefills --------------------------------------------------------------------------
    def chain(self, tenant: str, request_id: str, tokens: str) -> tuple[int, ...]:
        """The prompt's block hashes in ``tenant``'s namespace (``tokens`` packed), computed once
        per prefill."""
        key = (tenant, request_id)
        found = self._chains.get(key)
        if found is None:
            ids = unpack_tokens(tokens)
            found = self.namespaces.chain(tenant, ids, self.block_tokens)
            self._chains[key] = found
        return found

    def forget(self, tenant: str, request_id: str) -> None:
        self._chains.pop((tenant, request_id), None)

    def hit_tokens(
        self, process: str, chain: tuple[int, ...], num_prompt_tokens: int, now_s: float
    ) -> int:
        """Prompt tokens ``process``'s store is expected to find for this chain (0: none known)."""
        mirror = self.mirrors.get(process)
        if mirror is None:
            return 0
        limit = reusable_tokens(num_prompt_tokens, self.block_tokens)
        return mirror.cached_tokens(chain[: limit // self.block_tokens], limit, now_s)
