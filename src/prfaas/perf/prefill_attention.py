"""What a cached prefix adds to a prefill: the attention of the new tokens over it, fitted from a
profile's measured points (uncached and cached alike).

A prefill of ``n`` new tokens after ``c`` cached ones, in ``P`` forward passes, costs about
``alpha * P + beta * n + gamma * (n^2 / 2 + n * c)``: a fixed cost per pass, a cost per token
(the linear layers, the MLPs) and the attention, where each new token attends to every token
before it (the cached ones included). ``gamma`` (seconds per pair of a new token and a token it
attends to) is what a prefix adds: ``T(c + n) - T(c) + T(0)`` on a piecewise-linear curve (the
rule without it) charges a suffix the chord's slope between two measured lengths, which over a
convex curve is steeper than the attention at ``c``: 13-31% over the measured cached points of
five torch profiles (2026-12-05), within -11% to +6% with ``T(n) + gamma * n * c``.

Pure: numpy and scipy only, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from prfaas.perf.prefill_passes import pass_ends


class _Point(Protocol):
    @property
    def new_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def median_s(self) -> float: ...


def fit_attention_s(points: Sequence[_Point], pass_tokens: int | None) -> float | None:
    """``gamma`` of the points (seconds per attended pair), by non-negative least squares on
    relative residuals (short points weigh as much as long ones) over every point; None when no
    point is cached (nothing measures what a prefix adds: the caller keeps its rule) or the fit
    finds no attention. ``pass_tokens``: where the profile ended its passes (None: one pass)."""
    if not any(p.cached_tokens for p in points) or len(points) < 3:
        return None
    # Imported here: scipy.optimize costs ~0.6 s of start-up that only a fit needs.
    from scipy.optimize import nnls  # type: ignore[import-untyped]

    rows = []
    for p in points:
        n, c = p.new_tokens, p.cached_tokens
        passes = len(pass_ends(c, c + n, pass_tokens, None))
        rows.append([float(passes), float(n), n * n / 2 + n * c])
    y = np.array([p.median_s for p in points])
    scale = 1.0 / y
    coef, _ = nnls(np.array(rows) * scale[:, None], y * scale)
    gamma = float(coef[2])
    # Attention under a thousandth of the longest point's time is the fit's rounding, not a cost.
    longest = max(range(len(rows)), key=lambda i: rows[i][2])
    return gamma if gamma * rows[longest][2] > 1e-3 * y[longest] else None
