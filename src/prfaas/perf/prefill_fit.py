"""A prefill's cost by what the engine does: a cost per forward pass, per token and per attended
pair, fitted from a profile's measured points (uncached and cached alike).

A prefill of ``n`` new tokens after ``c`` cached ones, in ``P`` forward passes, costs about
``alpha * P + beta * n + gamma * (n^2 / 2 + n * c)``: a fixed cost per pass, a cost per token
(the linear layers, the MLPs) and the attention, where each new token attends to every token
before it (the cached ones included).

Two uses (``perf.cost_model.CostModel.prefill_s``):

- **A profile that knows its passes** (``prfaas profile --pass-tokens``: the torch engine ends a
  pass at every block boundary) is priced by the whole fit. A piecewise-linear curve through a
  few lengths misses the pass a prompt starts past a boundary: the tiny Qwen3-Next's node took
  42-46 ms of CPU for 533 tokens (two passes) where the curve between 256 and 1,024 said 29, and
  78-80 ms for 1,100 (three) where it said 59 (2026-12-05, ``alpha`` 6-7 ms a pass); beside the
  fit the live figures read one ratio at every length (1.12-1.18), beside the curve 1.04-1.29.
  Over six torch profiles the fit is within 6% of every measured point.
- **Otherwise, a cached prefix's attention** (``gamma``): a suffix costs ``T(n) + gamma * n * c``
  where ``T(c + n) - T(c) + T(0)`` on the curve (the rule without it) charges the chord's slope
  between two measured lengths, steeper than the attention at ``c`` over a convex curve: 13-31%
  over the measured cached points of five torch profiles, -11% to +6% with ``gamma``.

Pure: numpy and scipy only, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class PrefillFit:
    per_pass_s: float
    per_token_s: float
    attention_s: float
    """Seconds per pair of a new token and a token before it that it attends to (``gamma``)."""
    pass_tokens: int | None
    """Where the profile ended its passes (a pass at every multiple); None: one pass a prefill,
    the fit then prices only a cached prefix's attention."""

    def seconds(self, num_new_tokens: int, num_cached_tokens: int = 0) -> float:
        """The fit's time for a prefill in the passes the engine runs (``pass_tokens`` set)."""
        n, c = num_new_tokens, num_cached_tokens
        block = self.pass_tokens
        # The passes ``pass_ends(c, c + n, block, None)`` counts, without building the list
        # (one call per simulated request): one per block boundary crossed, plus the last.
        passes = 1 if block is None else (c + n - 1) // block - c // block + 1
        return (
            self.per_pass_s * passes + self.per_token_s * n + self.attention_s * (n * n / 2 + n * c)
        )


def fit_prefill(points: Sequence[_Point], pass_tokens: int | None) -> PrefillFit | None:
    """The fit of ``points`` by non-negative least squares on relative residuals (short points
    weigh as much as long ones), or None where it would add nothing to the profile's curve:
    fewer than three points, or one pass a prefill and no cached point (nothing then measures
    passes or what a prefix adds). ``pass_tokens``: where the profile ended its passes. A fit
    of one-pass points that finds no attention (under a thousandth of the longest point's time:
    the fit's rounding) is None too: the curve's rule stands."""
    if len(points) < 3 or (pass_tokens is None and not any(p.cached_tokens for p in points)):
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
    fit = PrefillFit(float(coef[0]), float(coef[1]), float(coef[2]), pass_tokens)
    longest = max(range(len(rows)), key=lambda i: rows[i][2])
    if pass_tokens is None and fit.attention_s * rows[longest][2] <= 1e-3 * y[longest]:
        return None
    return fit
