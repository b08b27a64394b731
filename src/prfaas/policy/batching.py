"""Prefill batching under a token budget, and decode admission (``BS_max`` and KV memory).

Prefill: the next batch is the longest head of the node's FIFO queue whose uncached tokens fit
``token_budget`` (the head request always goes, alone if it is larger). Requests are not split
into chunks: with the shipped profiles a chunk pays the fixed per-prefill overhead ``T(0)`` again
(``CostModel.prefill_s`` of a suffix), so chunking would only lose capacity; short requests still
ride together in one batch.

Decode: a request joins a node's running batch when the batch is below ``max_batch`` (``BS_max``,
the batch at which a step still meets the per-token SLO) and its KV fits the node's free memory.
Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prfaas.core.views import NodeLoad
from prfaas.policy.decisions import AdmitDecision, PrefillBatch

PREFILL_LOOKAHEAD = 64
"""Queued requests a driver shows ``PrefillBatcher.next_batch`` (the head of the queue): both the
simulator and the timed engine pass at most this many, so they form the same batches."""

_ADMIT = AdmitDecision(True, "fits")
_FULL = AdmitDecision(False, "batch full")
_NO_MEMORY = AdmitDecision(False, "KV memory full")
_DRAINING = AdmitDecision(False, "draining")


@dataclass(frozen=True, slots=True)
class PrefillBatcher:
    token_budget: int = 32768

    def __post_init__(self) -> None:
        if self.token_budget <= 0:
            raise ValueError(f"prefill token budget must be > 0, got {self.token_budget}")

    def next_batch(self, queued_tokens: Iterable[int]) -> PrefillBatch:
        """``queued_tokens``: uncached tokens of the waiting requests, queue order. Read only as
        far as the batch goes (one past its last request): a driver may pass them lazily."""
        tokens_of = iter(queued_tokens)
        first = next(tokens_of, None)
        if first is None:
            return PrefillBatch(0, 0)
        total = first
        count = 1
        budget = self.token_budget
        for tokens in tokens_of:
            if total + tokens > budget:
                break
            total += tokens
            count += 1
        return PrefillBatch(count, total)

    def steps(self, num_tokens: int) -> int:
        """Engine steps a batch of ``num_tokens`` uncached tokens takes at the budget a step
        (the chunks an engine that mixes prefill and decode in its steps cuts it into)."""
        return max(1, -(-num_tokens // self.token_budget))


@dataclass(frozen=True, slots=True)
class DecodeAdmission:
    max_batch: int

    def __post_init__(self) -> None:
        if self.max_batch <= 0:
            raise ValueError(f"decode max batch must be > 0, got {self.max_batch}")

    def admit(self, load: NodeLoad, kv_bytes: int) -> AdmitDecision:
        if load.draining:
            return _DRAINING
        if load.batch_size >= self.max_batch:
            return _FULL
        if kv_bytes > load.kv_free_bytes:
            return _NO_MEMORY
        return _ADMIT

    def admit_fast(self, batch_size: int, kv_used_bytes: int, kv_capacity: int, kv: int) -> bool:
        """``admit`` without building a ``NodeLoad`` (the simulator's hot path); same rule."""
        return batch_size < self.max_batch and kv_used_bytes + kv <= kv_capacity
