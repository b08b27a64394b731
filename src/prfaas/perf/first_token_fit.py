"""``fit_first_token_waits``: a new request's first token's waits beyond the cost model, alone and
per request decoding beside it, from probes' gaps (live TTFT minus simulated).

A probe's gap is ``w + n v`` for ``n`` requests decoding at its decode node when its KV is ready:
``w`` the hops between the processes a request crosses that no CPU term holds, ``v`` each
decoding stream's tokens relayed ahead of it (``perf.plumbing``'s ``first_token_wait_s`` and
``first_token_wait_per_decoding_s``). The line is fitted by non-negative least squares: neither
a wait nor its growth can be negative, so where the free line makes one negative it is held at 0
and the other fitted alone, and ``how`` says what the free line read.

Pure: no I/O, no clock; imports nothing from prfaas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class FirstTokenWaits:
    alone_s: float
    """``first_token_wait_s``: the line's intercept."""
    per_decoding_s: float
    """``first_token_wait_per_decoding_s``: its slope."""
    how: str


def fit_first_token_waits(decoding: Sequence[float], gap_s: Sequence[float]) -> FirstTokenWaits:
    """The line through ``gap_s`` over ``decoding`` (two or more distinct counts, else the slope is
    not told from the intercept: ``ValueError``)."""
    from scipy.optimize import nnls  # type: ignore[import-untyped]

    x, y = np.asarray(decoding, float), np.asarray(gap_s, float)
    if len(x) != len(y) or len(set(x.tolist())) < 2:
        raise ValueError("need gaps at two or more different counts of requests decoding")
    (alone, per), _ = nnls(np.column_stack([np.ones_like(x), x]), y)
    how = (
        f"non-negative least squares: {alone * 1e3:.3g} ms alone, "
        f"{per * 1e3:.3g} ms more per request decoding"
    )
    free_per, free_alone = np.polyfit(x, y, 1)
    if min(free_alone, free_per) < 0:
        how += (
            f" (unconstrained: {free_alone * 1e3:.3g} ms and {free_per * 1e3:.3g} ms each; "
            "the negative one held at 0)"
        )
    return FirstTokenWaits(float(alone), float(per), how)
