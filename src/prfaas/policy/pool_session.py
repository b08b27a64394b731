"""``PoolSession``: a tenant gateway's view of the pool it offloads to, and when to fall back.

Every pool answer carries the front door's epoch. The session remembers the epoch it last heard
and the prefills it submitted that have not started (started: the tenant's receiver saw the KV
session open, or the pool said ``running``). It sends a pending prefill to local prefill when:
the epoch changed (the front door restarted: what it had queued is gone, ``epoch_changed``); the
pool has been silent for ``silence_s`` (a missed heartbeat window, ``pool_silent``); the submit
was refused (``refused:<reason>``) or could not be sent (``pool_unreachable``); or the pool
reported it failed or aborted (``failed:<reason>``). Every fallback is counted by reason. A prefill
that started is left to finish: its KV goes from the pool node to the tenant's decode node, not
through the front door. Pure: ``now`` passed in; no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fallback:
    request_id: str
    reason: str


class PoolSession:
    def __init__(self, silence_s: float) -> None:
        if not silence_s > 0:
            raise ValueError(f"silence_s must be > 0, got {silence_s}")
        self.silence_s = silence_s
        self.epoch: int | None = None
        self.last_heard_s = -float("inf")
        self._pending: dict[str, float] = {}
        self.fallbacks: Counter[str] = Counter()

    def usable(self, now: float) -> bool:
        """Whether to offload at all: the pool answered within ``silence_s``."""
        return self.epoch is not None and now - self.last_heard_s <= self.silence_s

    def heard(self, epoch: int, now: float) -> tuple[Fallback, ...]:
        """Any answer from the pool (submit, heartbeat, outcome) with its epoch."""
        self.last_heard_s = now
        if self.epoch is None or epoch == self.epoch:
            self.epoch = epoch
            return ()
        self.epoch = epoch
        return self._all("epoch_changed")

    def submitted(self, request_id: str, now: float) -> None:
        """Accepted by the pool (at the epoch ``heard`` was just told)."""
        self._pending[request_id] = now

    def started(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def refused(self, request_id: str, reason: str) -> Fallback:
        return self._one(request_id, f"refused:{reason}")

    def unreachable(self, request_id: str) -> Fallback:
        return self._one(request_id, "pool_unreachable")

    def failed(self, request_id: str, reason: str) -> Fallback:
        return self._one(request_id, f"failed:{reason}")

    def tick(self, now: float) -> tuple[Fallback, ...]:
        """On the tenant's timer: a silent pool's pending prefills go local."""
        if self._pending and now - self.last_heard_s > self.silence_s:
            return self._all("pool_silent")
        return ()

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def _one(self, request_id: str, reason: str) -> Fallback:
        self._pending.pop(request_id, None)
        self.fallbacks[reason] += 1
        return Fallback(request_id, reason)

    def _all(self, reason: str) -> tuple[Fallback, ...]:
        out = tuple(Fallback(r, reason) for r in self._pending)
        self._pending.clear()
        if out:
            self.fallbacks[reason] += len(out)
        return out
