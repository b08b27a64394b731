"""``fit_first_token_waits``: a new request's first token's waits beyond the cost model, alone and
per request decoding beside it, from classes of probes' gaps (live TTFT minus simulated).

A probe's gap is ``w + n v`` for ``n`` requests decoding at its decode node when its KV is ready:
``w`` the hops between the processes a request crosses that no CPU term holds, ``v`` each
decoding stream's tokens relayed ahead of it (``perf.plumbing``'s ``first_token_wait_s`` and
``first_token_wait_per_decoding_s``). Each term is read from the class that isolates it, on
medians: the class with the fewest decoding (nobody, where the probes are alone) anchors the line,
``v`` is the least-squares slope through that anchor of the other classes' median gaps over their
median counts, and ``w`` the anchor's gap less ``v`` times its count (its gap itself where nobody
decoded). A line through every probe instead let one class's slow probes set both: on torch nodes
sharing a core, probes read 9.9, 87 and 40 ms beyond the simulator with 0, 8 and 16 decoding, and
the free line put 48 ms on every request where those alone waited 10 (2026-12-06). Neither can be
negative: a negative reading is stored as 0 and ``how`` says what it read.

Pure: no I/O, no clock; imports nothing from prfaas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median


@dataclass(frozen=True, slots=True)
class ProbeGaps:
    """One class of probes: how many requests decoded at each probe's KV (the simulator's count)
    and each probe's gap (seconds)."""

    decoding: tuple[int, ...]
    gap_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class FirstTokenWaits:
    alone_s: float
    """``first_token_wait_s``."""
    per_decoding_s: float
    """``first_token_wait_per_decoding_s``."""
    how: str


def fit_first_token_waits(classes: Sequence[ProbeGaps]) -> FirstTokenWaits:
    """The two waits of ``classes``: their median counts must differ (a class alone and one
    beside a batch), else ``ValueError``."""
    points = sorted((median(c.decoding), median(c.gap_s)) for c in classes if c.gap_s)
    if len({n for n, _ in points}) < 2:
        raise ValueError(
            "the probe classes met no different counts of requests decoding: the waits alone and "
            "per request decoding are not told apart"
        )
    (n0, g0), rest = points[0], [(n, g) for n, g in points if n > points[0][0]]
    per = sum((n - n0) * (g - g0) for n, g in rest) / sum((n - n0) ** 2 for n, _ in rest)
    alone = g0 - max(per, 0.0) * n0
    how = (
        "medians: " + ", ".join(f"{g * 1e3:.3g} ms at {n:g} decoding" for n, g in points)
        + f"; alone {max(alone, 0.0) * 1e3:.3g} ms, per request decoding "
        + f"{max(per, 0.0) * 1e3:.3g} ms (least squares through the fewest decoding)"
    )  # fmt: skip
    held = [name for name, v in (("alone", alone), ("per request", per)) if v < 0]
    if held:
        how += f"; read negative, stored 0: {', '.join(held)}"
    return FirstTokenWaits(max(alone, 0.0), max(per, 0.0), how)
