"""What both ``prfaas profile`` sources share: a measured point's median and spread, and the
progress bar over the points. Not pure (rich draws on stderr)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median_spread(samples: Sequence[float]) -> tuple[float, float]:
    return statistics.median(samples), max(samples) - min(samples)


class PointProgress:
    """A rich progress bar on stderr over every measured point."""

    def __init__(self, total: int, what: str) -> None:
        from rich.console import Console
        from rich.progress import Progress

        self._bar = Progress(console=Console(stderr=True), transient=False)
        self._task = self._bar.add_task(what, total=total)

    def __enter__(self) -> PointProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(None, None, None)

    def step(self, label: str) -> None:
        self._bar.update(self._task, advance=1, description=label)
