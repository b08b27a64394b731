"""``fit_relay``: a relaying process's CPU split into per request, per step and per token, by
least squares over classes of requests at several batch sizes.

A process that relays a server's tokens (the gateway; a vLLM site's sidecar) pays a fixed cost per
request, one wake-up per step of the server (it relays the step's tokens together) and a cost per
token. A class of ``n`` requests whose ``N`` tokens came in ``S`` steps cost it ``X = n q + S a +
N c``. One request at a time every token is its own step (``S = N``), so classes at batch 1 pin
only ``q`` and ``a + c``; a class at a larger batch (``N > S``) tells ``a`` from ``c``. One
batched class (8 at once) put the whole split on it: the sidecar's per-token term read 0.14 to
0.66 ms between profiles of one deployment, and by hand its cost per token kept falling from
batch 8 to 32 (docs/fidelity.md, fifth vLLM round). Here every class counts, weighted by its
noise: per request, ``max(REL_NOISE x its figure, a CPU clock tick over its requests)``. The
terms are kept >= 0 (non-negative least squares); a term the fit holds at 0 is named in
``clipped``, and each class's residual is returned for the profile's ``how``.

Pure: no I/O, no clock; imports nothing from prfaas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

REL_NOISE = 0.05
"""A class's per-request CPU repeats within about this fraction (a busy machine's jitter)."""
TICK_S = 0.01
"""``/proc`` counts CPU in clock ticks: a class's total is uncertain by about one."""


@dataclass(frozen=True, slots=True)
class RelayClass:
    """What one class of requests cost a relaying process."""

    num_requests: int
    num_steps: int
    """The server's steps the class's tokens came in (its first tokens' included)."""
    num_tokens: int
    cpu_s: float
    """The process's CPU seconds over the class, its idle rate removed."""

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.num_steps < 1 or self.num_tokens < 1:
            raise ValueError(
                f"a class needs requests, steps and tokens >= 1, got {self.num_requests}, "
                f"{self.num_steps}, {self.num_tokens}"
            )


@dataclass(frozen=True, slots=True)
class RelayFit:
    per_request_s: float
    per_step_s: float
    per_output_token_s: float
    residuals: tuple[float, ...]
    """Per class, in order: (fitted - measured) / measured CPU (0 where nothing was measured)."""
    clipped: tuple[str, ...] = ()
    """Terms the fit held at 0 (their free value was negative: noise)."""

    def describe(self, classes: Sequence[RelayClass]) -> str:
        """One line for a profile's ``how``: each class and how far the fit is from it."""
        parts = [
            f"{c.num_requests} requests, {c.num_tokens} tokens in {c.num_steps} steps, "
            f"{c.cpu_s:.4g} CPU s (fit {r:+.0%})"
            for c, r in zip(classes, self.residuals, strict=True)
        ]
        held = "".join(f"; {t} held at 0 (noise)" for t in self.clipped)
        return (
            f"least squares over {len(classes)} classes ({'; '.join(parts)}): per request "
            f"{self.per_request_s:.4g} s, per step {self.per_step_s:.4g} s, per token "
            f"{self.per_output_token_s:.4g} s{held}"
        )


def fit_relay(classes: Sequence[RelayClass]) -> RelayFit:
    """The split of ``classes`` (three or more; at least one with more tokens than steps and two
    with different tokens a request, else the terms are not told apart: ``ValueError``)."""
    from scipy.optimize import nnls  # type: ignore[import-untyped]

    if len(classes) < 3:
        raise ValueError(f"need three or more classes, got {len(classes)}")
    rows = np.array(
        [[1.0, c.num_steps / c.num_requests, c.num_tokens / c.num_requests] for c in classes]
    )
    if np.linalg.matrix_rank(rows) < 3:
        raise ValueError(
            "the classes do not tell the terms apart: need one with more tokens than steps (a "
            "batch over 1) and two with different tokens a request"
        )
    y = np.array([c.cpu_s / c.num_requests for c in classes])
    sigma = np.array(
        [max(REL_NOISE * abs(v), TICK_S / c.num_requests) for v, c in zip(y, classes, strict=True)]
    )
    coef, _ = nnls(rows / sigma[:, None], y / sigma)
    fitted = rows @ coef
    residuals = tuple(float((f - v) / v) if v > 0 else 0.0 for f, v in zip(fitted, y, strict=True))
    names = ("per request", "per step", "per token")
    clipped = tuple(n for n, v in zip(names, coef, strict=True) if v <= 0.0)
    return RelayFit(float(coef[0]), float(coef[1]), float(coef[2]), residuals, clipped)
