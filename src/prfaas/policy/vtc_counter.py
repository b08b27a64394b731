"""A tenant's virtual counter under VTC lifts whose charges can be corrected after the fact
(``policy.pool_admission``: a prefill's start is charged what its node is expected to compute,
and trued up, or refunded, when it ends).

VTC (OSDI'24) lifts a tenant that comes back from idle to the lowest active counter, so that it
is not owed its idle time. A correction of a charge made *before* such a lift must act "as if the
start had been charged so": the lift already covered part of it. So the counter is kept in its
max-plus form: ``max(start + charges, lift_1 + charges since lift_1, ...)``, one term per lift;
a charge now adds to every term, a correction of a charge made at sequence ``s`` only to the terms
that started before ``s`` (those that hold it). Terms that no held charge separates take the same
corrections from then on and are merged, so there is one term when nothing is held.

Pure: no I/O, no clock (sequence numbers are the caller's).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Term:
    """Where a term started (``since``: the caller's sequence at the lift, -1 for the tenant's
    own start) and its value now (that start plus every charge and correction since)."""

    since: int
    value: float


@dataclass(slots=True)
class LiftedCounter:
    value: float = 0.0
    """The max of the terms: what the fair-share order reads."""
    _terms: list[_Term] = field(default_factory=lambda: [_Term(-1, 0.0)])

    def add(self, amount: float, before: int | None = None) -> None:
        """Add ``amount`` to the terms that started before ``before`` (None: to all: a charge
        now)."""
        for t in self._terms:
            if before is None or t.since < before:
                t.value += amount
        self.value = max(t.value for t in self._terms)

    def lift(self, to: float, seq: int) -> None:
        """VTC: the counter becomes ``max(value, to)``, as a term of its own."""
        self._terms.append(_Term(seq, to))
        self.value = max(self.value, to)

    def reset(self, to: float, seq: int) -> None:
        self._terms = [_Term(seq, to)]
        self.value = to

    def prune(self, held: Collection[int]) -> None:
        """Merge the terms no held charge (its start's sequence) separates."""
        merged: list[_Term] = []
        for t in sorted(self._terms, key=lambda t: t.since):
            last = merged[-1] if merged else None
            if last is not None and not any(last.since < s <= t.since for s in held):
                last.value = max(last.value, t.value)
            else:
                merged.append(_Term(t.since, t.value))
        self._terms = merged

    def num_terms(self) -> int:
        return len(self._terms)
