"""``SharedCores``: the cores one site's simulated nodes run on together.

A site whose node processes are pinned to the same cores (``engine.cpus``: on a small host, a
prefill and a decode node on one core) does not have one machine per node, as the cost model's
per-node timings assume. Processor sharing: while the site's busy nodes want more cores than it
has, each runs at ``cores / demand`` of its own speed (a torch node's demand is its ``threads``).
A gateway pinned to the site's cores (``gateway.cpus``, ``SimSite.hosts_gateway``) takes its
share of them first: its work comes in short pieces that the kernel runs as soon as they wake
(a sleeper's priority), so the nodes share what it leaves, ``cores - share``, and, time-sharing
with it (it and they want more than the cores), lose the same ``overhead`` as beside another
node; the share is read whenever a speed is set (a batch starts, the busy count changes, a
decode span begins).

The simulator counts busy nodes here and scales work by ``slowdown`` as it goes: a decode node's
span and a prefill batch whose KV stays on its site are re-timed whenever the count changes (at
the decode's next step boundary; the prefill from that instant); a prefill whose KV crosses to
another site keeps the speed it started with (its link flow is paced by it).

Mixed steps (``mixed_steps``): a site whose one prefill and one decode node are one engine (a
vLLM server serves both roles: ``prfaas up`` runs one per vLLM site) does not time-share two
processes. Each of its steps carries the whole decode batch and a chunk of the prefill (vLLM's
chunked prefill, ``max_num_batched_tokens`` a step): while both compute, a decode step takes
the prefill chunk's time plus what its batch adds to a step (its own step less the fixed part
every step pays once, ``CostModel.decode_step_fixed_s``), and the prefill is slowed by that
same addition per chunk. Time-shared, the fixed part would be paid twice and each role would
wait for the other's whole steps (measured: the simulated PD work of a vLLM site 1.3-1.8x the
server's CPU; docs/fidelity.md).

Pure: no clock, no I/O; the simulator owns the counts' transitions.
"""

from __future__ import annotations

from collections.abc import Callable

MAX_GATEWAY_SHARE = 0.9
"""Of the cores: the gateway's estimated share is capped here (a runaway estimate would stop
the nodes; the gateway's own backlog shows an overloaded gateway instead)."""


class SharedCores:
    __slots__ = ("busy", "chunk_s", "cores", "decode_extra_s", "gateway_share", "mixed_steps",
                 "overhead", "threads_per_node")  # fmt: skip

    def __init__(
        self, cores: int, threads_per_node: int = 1, overhead: float = 0.0,
        mixed_steps: bool = False,
    ) -> None:  # fmt: skip
        """``overhead``: the profile's ``shared_core_overhead``, the CPU a node loses beyond its
        own work while another process time-shares its core (a fraction of that work);
        ``mixed_steps``: the site's prefill and decode node are one engine (module doc)."""
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
        self.mixed_steps = mixed_steps
        self.chunk_s = 0.0
        """Mixed steps: the computing prefill's own-speed time per step (its batch's work over
        the steps its tokens take)."""
        self.decode_extra_s = 0.0
        """Mixed steps: what the decode batch adds to a step (its own step less the fixed part)."""

    def slowdown(self) -> float:
        """How much longer work takes than on a node's own cores, at the current demand (and,
        while the cores are time-shared, the CPU that sharing itself costs). A mixed-step
        engine is one process, however many of its roles compute."""
        busy = self.busy
        if self.mixed_steps and busy > 1:
            busy = 1
        demand = busy * self.threads_per_node
        cores = self.cores
        if self.gateway_share is None:
            return demand / cores * (1.0 + self.overhead) if demand > cores else 1.0
        share = self.gateway_share()
        if share > MAX_GATEWAY_SHARE * cores:
            share = MAX_GATEWAY_SHARE * cores
        left = cores - share
        if demand <= left:
            return 1.0
        # The gateway's pieces and the nodes want more than the cores: they time-share, and the
        # switches to the gateway and back cost a node the refills another node's would (its
        # engine thread, in service beside the gateway: 1.23-1.36x the curve where the profile,
        # alone, read 1.11x; docs/fidelity.md, twenty-first round).
        return demand / left * (1.0 + self.overhead)

    def prefill_slowdown(self) -> float:
        """``slowdown`` for a prefill; with mixed steps while the decode computes too, each of
        its chunks also carries the decode batch (``decode_extra_s``)."""
        factor = self.slowdown()
        if self.mixed_steps and self.busy > 1 and self.chunk_s > 0.0:
            return factor * (1.0 + self.decode_extra_s / self.chunk_s)
        return factor

    def decode_slowdown(self, step_s: float, fixed_s: float) -> float:
        """``slowdown`` for a decode span whose own step takes ``step_s`` (``fixed_s`` of it paid
        once per step whatever the step carries); with mixed steps it records what the batch
        adds to a step and, while a prefill computes too, stretches each step to the prefill's
        chunk plus that addition."""
        factor = self.slowdown()
        if not self.mixed_steps or step_s <= 0.0:
            return factor
        extra = step_s - (fixed_s if fixed_s > 0.0 else 0.0)
        self.decode_extra_s = extra if extra > 0.0 else 0.0
        if self.busy > 1:
            mixed_s = self.chunk_s + self.decode_extra_s
            if mixed_s > step_s:
                return factor * mixed_s / step_s
        return factor
