"""``SharedCores``: the cores one site's simulated nodes run on together.

A site whose node processes are pinned to the same cores (``engine.cpus``: on a small host, a
prefill and a decode node on one core) does not have one machine per node, as the cost model's
per-node timings assume. Processor sharing: while the site's busy nodes want more cores than it
has, each runs at ``cores / demand`` of its own speed (a torch node's demand is its ``threads``).
The simulator counts busy nodes here and scales work by ``slowdown`` as it goes: a decode node's
span and a prefill batch whose KV stays on its site are re-timed whenever the count changes (at
the decode's next step boundary; the prefill from that instant); a prefill whose KV crosses to
another site keeps the speed it started with (its link flow is paced by it).

Pure: no clock, no I/O; the simulator owns the counts' transitions.
"""

from __future__ import annotations


class SharedCores:
    __slots__ = ("busy", "cores", "overhead", "threads_per_node")

    def __init__(self, cores: int, threads_per_node: int = 1, overhead: float = 0.0) -> None:
        """``overhead``: the profile's ``shared_core_overhead``, the CPU a node loses beyond its
        own work while another process time-shares its core (a fraction of that work)."""
        if cores < 1 or threads_per_node < 1:
            raise ValueError(f"need cores >= 1 and threads >= 1, got {cores}, {threads_per_node}")
        if not overhead >= 0.0:
            raise ValueError(f"overhead must be >= 0, got {overhead!r}")
        self.cores = cores
        self.threads_per_node = threads_per_node
        self.overhead = overhead
        self.busy = 0
        """Nodes of the site computing now (a prefill batch, a non-empty decode batch)."""

    def slowdown(self) -> float:
        """How much longer work takes than on a node's own cores, at the current demand (and,
        while the cores are time-shared, the CPU that sharing itself costs)."""
        demand = self.busy * self.threads_per_node
        return demand / self.cores * (1.0 + self.overhead) if demand > self.cores else 1.0
