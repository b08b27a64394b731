"""``SimRequest``: the simulator's mutable per-request record (times of every stage).

Mutable and slotted for speed: a run touches it a dozen times. It never leaves ``sim/``; what
policies see of it is a ``RequestView``. The nodes serving it are not recorded here (they hold
their requests; the decode node travels in the ``Handoff`` payload; only their ids are kept,
for per-request exports), so this module imports no node type.

``state`` is where the request is: a ``core.RequestState``, moved by the stages through
``core.request.TRANSITIONS`` (QUEUED -> ROUTED at routing, or FAILED; -> PREFILLING at its batch's
start; -> TRANSFERRING when the prefill ends, the last layer crossing a link or the local fabric;
-> DECODING when the KV is whole at the decode node; -> FINISHED). Each move is checked against the
table inline, and one it forbids raises ``InvalidTransition``. The stage times are what exports
read: a time of a stage not reached yet is ``-1.0``, never a stand-in for the state. Pure.
"""

from __future__ import annotations

from prfaas.core.ids import NodeId
from prfaas.core.request import RequestState
from prfaas.sim.link import Flow

_NO_NODE = NodeId("")
_QUEUED = RequestState.QUEUED  # a module constant: one lookup per request, not an enum access


class SimRequest:
    __slots__ = (
        "arrival_s",
        "block_hashes",
        "cached_home",
        "context",
        "decode_node",
        "decode_start_s",
        "finish_s",
        "flow",
        "home",
        "index",
        "kv_bytes",
        "kv_ready_s",
        "num_cached",
        "num_output",
        "num_prompt",
        "offloaded",
        "prefill_end_s",
        "prefill_node",
        "prefill_start_s",
        "remaining_steps",
        "rerouted",
        "state",
        "transfer_bytes",
        "work_s",
    )

    def __init__(
        self,
        index: int,
        arrival_s: float,
        num_prompt: int,
        num_output: int,
        block_hashes: tuple[int, ...],
        home: int,
    ) -> None:
        self.index = index
        self.arrival_s = arrival_s
        self.num_prompt = num_prompt
        self.num_output = num_output
        self.block_hashes = block_hashes
        self.home = home
        self.state = _QUEUED
        self.num_cached = 0
        """Prefix tokens reused at the prefill site."""
        self.cached_home = 0
        """Prefix tokens the home (decode) site already holds: they need not cross."""
        self.offloaded = False
        self.rerouted = False
        self.prefill_node = _NO_NODE
        """The node that prefilled it (its id), once its batch started; for per-request exports."""
        self.decode_node = _NO_NODE
        """The decode node chosen at routing time (its id)."""
        self.work_s = 0.0
        self.transfer_bytes = 0
        self.kv_bytes = 0
        self.flow: Flow | None = None
        """The KV transfer in flight over an inter-site link, if any."""
        self.prefill_start_s = -1.0
        self.prefill_end_s = -1.0
        self.kv_ready_s = -1.0
        self.decode_start_s = -1.0
        self.finish_s = -1.0
        self.remaining_steps = num_output
        self.context = num_prompt

    @property
    def num_uncached(self) -> int:
        return self.num_prompt - self.num_cached
