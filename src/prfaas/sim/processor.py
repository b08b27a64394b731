"""``SharedCores``: the cores one site's simulated nodes run on together.

A site whose node processes are pinned to the same cores (``engine.cpus``: on a small host, a
prefill and a decode node on one core) does not have one machine per node, as the cost model's
per-node timings assume. Processor sharing: while the site's busy nodes want more cores than it
has, each runs at ``cores / demand`` of its own speed (a torch node's demand is its ``threads``).
A gateway pinned to the site's cores (``gateway.cpus``, ``SimSite.hosts_gateway``) takes its
share of them first: its work comes in short pieces that the kernel runs as soon as they wake
(a sleeper's priority), so the nodes share what it leaves, ``cores - share``; the share is read
whenever a speed is set (a batch starts, the busy count changes, a decode span begins).
The simulator counts busy nodes here and scales work by ``slowdown`` as it goes: a decode node's
span and a prefill batch whose KV stays on its site are re-timed whenever the count changes (at
the decode's next step boundary; the prefill from that instant); a prefill whose KV crosses to
another site keeps the speed it started with (its link flow is paced by it).

Pure: no clock, no I/O; the simulator owns the counts' transitions.
"""

from __future__ import annotations

from collections.abc import Callable

MAX_GATEWAY_SHARE = 0.9
"""Of the cores: the gateway's estimated share is capped here (a runaway estimate would stop
the nodes; the gateway's own backlog shows an overloaded gateway instead)."""


class SharedCores:
    __slots__ = ("busy", "cores", "gateway_share", "overhead", "threads_per_node")

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
        self.gateway_share: Callable[[], float] | None = None
        """The cores the gateway pinned here takes now, a fraction of one (``GatewayCpu.share``);
        None: no gateway here."""

    def slowdown(self) -> float:
        """How much longer work takes than on a node's own cores, at the current demand (and,
        while the cores are time-shared, the CPU that sharing itself costs)."""
        demand = self.busy * self.threads_per_node
        cores = self.cores
        if self.gateway_share is None:
            return demand / cores * (1.0 + self.overhead) if demand > cores else 1.0
        share = self.gateway_share()
        left = cores - (share if share < MAX_GATEWAY_SHARE * cores else MAX_GATEWAY_SHARE * cores)
        if demand <= left:
            return 1.0
        return demand / left * (1.0 + self.overhead) if demand > cores else demand / left
