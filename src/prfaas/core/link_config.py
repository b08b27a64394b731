"""``LinkConfig``: THE description of an inter-site link, one type for the deployment file's
``links:`` entries (``config.py`` validates them into it) and the simulator's scenario
(``sim.SimScenario.links``): before, each had its own with its own names and units.

The fields are the file's keys, in the file's units; the simulator reads ``bytes_per_s``,
``rtt_s`` and ``window_bytes``. A link is bidirectional: both directions get this bandwidth and
RTT. Values are checked on construction (a ``ValueError`` naming the field); rules that depend on
the rest of a deployment (a file's link needs capacity; a simulated prfaas site in use needs a
link above 0 Gbps) are checked by the file and by ``SimScenario.validate``.

Pure: stdlib only (pydantic validates it as a plain dataclass; this module knows nothing of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class LinkConfig:
    src: str
    dst: str
    gbps: float
    """Capacity, Gbit/s (modelled: what the emulated engines' units mean)."""
    rtt_ms: float = 0.0
    connections: int = 8
    """TCP connections per transfer (the simulator's RTT-limited rate)."""
    window_mib: float = 16.0
    """TCP window per connection (MEASURED.md: 4 MiB default cap, 64 MiB after tuning)."""
    schedule: tuple[tuple[float, float], ...] = ()
    """Simulation: capacity steps ``((time_s, gbps), ...)``, e.g. ``((60, 10), (120, 100))`` for
    a 60 s dip to 10 Gbps (a live link is not stepped)."""

    def __post_init__(self) -> None:
        name = f"link {self.src}-{self.dst}"
        if not (self.gbps >= 0 and math.isfinite(self.gbps)):
            raise ValueError(f"{name}: gbps must be >= 0, got {self.gbps}")
        if not (self.rtt_ms >= 0 and math.isfinite(self.rtt_ms)):
            raise ValueError(f"{name}: rtt_ms must be >= 0, got {self.rtt_ms}")
        if self.connections < 1:
            raise ValueError(f"{name}: connections must be >= 1, got {self.connections}")
        if not self.window_mib > 0:
            raise ValueError(f"{name}: window_mib must be > 0, got {self.window_mib}")
        for t_s, gbps in self.schedule:
            if t_s < 0 or gbps < 0:
                raise ValueError(f"{name}: schedule step ({t_s}, {gbps}) must be >= 0")

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8

    @property
    def rtt_s(self) -> float:
        return self.rtt_ms / 1000

    @property
    def window_bytes(self) -> float:
        return self.window_mib * MIB
