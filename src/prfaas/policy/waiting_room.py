"""``WaitingRoom``: may a request wait for a path that is not there yet, and for how long.

One rule for every case in which a request cannot be served the way it wants right now:

- a node restarts (the gateway sees no decode node in rotation): the request waits a bounded time
  for a path to come back, then is refused with the reason;
- the autoscaler started a node (its start-up has a known remainder): a request waits for it only
  while the expected start there, the remaining start-up included, beats the alternative (a local
  prefill); otherwise it takes the alternative at once.

The policy compares an *expected wait* against a *deadline* (the request's arrival plus
``max_wait_s``) and against the alternative's expected time. The driver asks again when the
returned ``recheck_at_s`` comes or when something changed (a node came back), and acts on the
verdict: ``SERVE`` (a path is there), ``WAIT``, ``ALTERNATIVE`` (go local now) or ``REFUSE``
(503 with ``reason``). Expected times are seconds from ``now_s``; None means unknown (a restart
whose return is not predicted) or, for the alternative, that there is none.

Pure: ``now_s`` is passed in; no clock, no I/O, no asyncio. Imports nothing from ``prfaas``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

DEFAULT_MAX_WAIT_S = 30.0
"""A client waits this long for a lost path by default: long enough for a supervised timed or
torch node to come back (seconds), and for most of a vLLM server's restart (36 s seen on a CPU
host), short of clients' own timeouts (60 s and more in common load generators)."""
DEFAULT_RECHECK_S = 0.25
"""With no expected return, the driver looks again this often (heartbeats come every ~0.5 s)."""


class WaitVerdict(enum.Enum):
    SERVE = "serve"
    """A path is there: go."""
    WAIT = "wait"
    """Wait until ``recheck_at_s`` (or an earlier change), then ask again."""
    ALTERNATIVE = "alternative"
    """Take the alternative (local prefill) now: waiting would not beat it."""
    REFUSE = "refuse"
    """Give up: 503 with ``reason``."""


@dataclass(frozen=True, slots=True)
class WaitDecision:
    verdict: WaitVerdict
    reason: str
    """Why; for a refusal, the text the client sees."""
    recheck_at_s: float | None = None
    """For ``WAIT``: when to ask again at the latest (never after the deadline)."""


@dataclass(frozen=True, slots=True)
class WaitingRoom:
    max_wait_s: float = DEFAULT_MAX_WAIT_S
    """How long after its arrival a request may still be waiting for a path; 0: never wait."""
    recheck_s: float = DEFAULT_RECHECK_S
    """How often to look again when the path's return is not predicted."""

    def __post_init__(self) -> None:
        if not (self.max_wait_s >= 0 and math.isfinite(self.max_wait_s)):
            raise ValueError(f"max_wait_s must be finite and >= 0, got {self.max_wait_s}")
        if not (self.recheck_s > 0 and math.isfinite(self.recheck_s)):
            raise ValueError(f"recheck_s must be finite and > 0, got {self.recheck_s}")

    def deadline_s(self, arrived_s: float) -> float:
        return arrived_s + self.max_wait_s

    def decide(
        self,
        *,
        arrived_s: float,
        now_s: float,
        missing: str | None,
        expected_path_s: float | None = None,
        alternative_s: float | None = None,
    ) -> WaitDecision:
        """``missing`` names what is not there (None: the path is there; ``SERVE``).
        ``expected_path_s``: seconds from now until the awaited path would have served the
        request (remaining start-up, queue and work there), None if not predicted.
        ``alternative_s``: seconds from now until the alternative would have, None if none."""
        if missing is None:
            return WaitDecision(WaitVerdict.SERVE, "a path is there")
        deadline = self.deadline_s(arrived_s)
        left_s = deadline - now_s
        if alternative_s is not None:
            if expected_path_s is None or expected_path_s >= alternative_s:
                why = "unknown" if expected_path_s is None else f"{expected_path_s:.1f} s"
                return WaitDecision(
                    WaitVerdict.ALTERNATIVE,
                    f"{missing}: expected in {why}, the alternative in {alternative_s:.1f} s",
                )
            if left_s <= 0 or expected_path_s > left_s:
                return WaitDecision(
                    WaitVerdict.ALTERNATIVE,
                    f"{missing}: expected in {expected_path_s:.1f} s, past the wait limit",
                )
        if left_s <= 0:
            return WaitDecision(
                WaitVerdict.REFUSE, f"{missing} (waited {self.max_wait_s:g} s for a path)"
            )
        if expected_path_s is not None and expected_path_s > left_s and alternative_s is None:
            # It will not be back in time: refuse now rather than hold the client for nothing.
            return WaitDecision(
                WaitVerdict.REFUSE,
                f"{missing} (expected back in {expected_path_s:.1f} s, over the "
                f"{self.max_wait_s:g} s wait limit)",
            )
        step_s = self.recheck_s if expected_path_s is None else max(expected_path_s, 0.0)
        recheck = min(deadline, now_s + max(step_s, 1e-3))
        return WaitDecision(WaitVerdict.WAIT, f"{missing}: waiting", recheck)
