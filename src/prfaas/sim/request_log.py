"""``RequestLog``: one row per finished request of a simulation run (what an operator exports to a
spreadsheet): arrival, route, prefill and decode node, queueing, TTFT, end to end, bytes crossed,
prefix hit. Fed by the simulator's ``on_finish`` hook; rows are frozen. Pure (the CLI writes the
CSV).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields

from prfaas.sim.request import SimRequest


@dataclass(frozen=True, slots=True)
class RequestRow:
    index: int
    arrival_s: float
    num_prompt_tokens: int
    num_cached_tokens: int
    """Prefix tokens reused at the prefill site (the prefix hit)."""
    num_output_tokens: int
    prefill_site: str
    prefill_node: str
    decode_node: str
    offloaded: bool
    rerouted: bool
    queueing_s: float
    """Arrival to the start of its prefill batch."""
    ttft_s: float
    """Arrival to its first token (the KV landed at the decode node)."""
    e2e_s: float
    cross_site_bytes: int
    """KV bytes that crossed an inter-site link for it (0: prefilled at its home site)."""
    prefix_hit: float
    """``num_cached_tokens / num_prompt_tokens``."""


COLUMNS = tuple(f.name for f in fields(RequestRow))


class RequestLog:
    """Collects a ``RequestRow`` per finished request; ``site_of`` maps a node id to its site."""

    def __init__(self, site_of: dict[str, str]) -> None:
        self._site_of = site_of
        self.rows: list[RequestRow] = []

    def __call__(self, req: SimRequest) -> None:
        self.rows.append(
            RequestRow(
                req.index, req.arrival_s, req.num_prompt, req.num_cached, req.num_output,
                self._site_of.get(req.prefill_node, ""), req.prefill_node, req.decode_node,
                req.offloaded, req.rerouted, req.prefill_start_s - req.arrival_s,
                req.kv_ready_s - req.arrival_s, req.finish_s - req.arrival_s,
                req.transfer_bytes, req.num_cached / req.num_prompt if req.num_prompt else 0.0,
            )
        )  # fmt: skip

    def table(self) -> list[tuple[object, ...]]:
        """The rows in arrival order, as tuples in ``COLUMNS`` order."""
        return [astuple(r) for r in sorted(self.rows, key=lambda r: r.index)]
