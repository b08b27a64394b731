"""``RequestLog``: one row per finished request of a simulation run (what an operator exports to a
spreadsheet): arrival, route, prefill and decode node, queueing, TTFT, end to end, bytes crossed,
prefix hit. Fed by the simulator's ``on_finish`` hook; rows are frozen. The columns are
``workload.request_columns`` (shared with ``prfaas bench --requests-csv``). Pure (the CLI writes
the CSV).
"""

from __future__ import annotations

from prfaas.sim.request import SimRequest
from prfaas.workload.request_columns import COLUMNS, RequestRow

__all__ = ["COLUMNS", "RequestLog", "RequestRow"]


class RequestLog:
    """Collects a ``RequestRow`` per finished request; ``site_of`` maps a node id to its site."""

    def __init__(self, site_of: dict[str, str]) -> None:
        self._site_of = site_of
        self.rows: list[RequestRow] = []

    def __call__(self, req: SimRequest) -> None:
        self.rows.append(
            RequestRow(
                req.index, req.arrival_s, req.num_prompt, req.num_cached, req.num_output,
                self._site_of.get(req.prefill_node), req.prefill_node, req.decode_node,
                req.offloaded, req.rerouted, req.prefill_start_s - req.arrival_s,
                req.kv_ready_s - req.arrival_s, req.finish_s - req.arrival_s,
                req.transfer_bytes, req.num_cached / req.num_prompt if req.num_prompt else 0.0,
            )
        )  # fmt: skip

    def table(self) -> list[RequestRow]:
        """The rows in arrival order."""
        return sorted(self.rows, key=lambda r: r.index)
