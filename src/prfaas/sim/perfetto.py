"""A trace a viewer opens: Chrome trace-event JSON (https://ui.perfetto.dev, chrome://tracing)
with a track per node and per link, and a span per request for its prefill, its KV transfer and
its decode.

``Span`` is one interval on one track; ``TraceLog`` (the simulator's ``on_finish`` hook) turns each
finished ``SimRequest`` into its spans; ``build_trace`` turns spans from any source (the
simulator here, ``prfaas bench``'s live timings in ``serve.loadgen.export``) into the JSON object.
Each track is a trace "process" (``pid``) named after its node or link; requests overlap on a
node (a prefill batch, a decode batch) and on a link (flows share it), so each track is split
into lanes (``tid``), the fewest such that spans in one lane never overlap: the viewer then draws
every span whole instead of mis-nesting them. Times are microseconds (the format's unit).
Pure: builds a dict, writes no file (``prfaas sim --perfetto`` does).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prfaas.sim.request import SimRequest

US_PER_S = 1e6
NODE_TRACK = "node "
LINK_TRACK = "link "
"""Track name prefixes: nodes are listed before links in the viewer."""


@dataclass(frozen=True, slots=True)
class Span:
    track: str
    """``"node <id>"`` or ``"link <src>-><dst>"`` (any other name sorts after them)."""
    category: str
    """What the span is: ``prefill``, ``transfer``, ``decode`` (live: ``to_first_token``)."""
    request: int
    start_s: float
    end_s: float
    args: tuple[tuple[str, int | float | str | bool], ...] = ()
    """Shown in the viewer's details pane."""

    @property
    def name(self) -> str:
        return f"{self.category} r{self.request}"


def sim_spans(req: SimRequest, site_of: dict[str, str]) -> list[Span]:
    """A finished request's spans: prefill on its prefill node, the KV transfer on the link it
    crossed (from its batch's start: KV streams layer by layer; to the KV landing, half an RTT
    after the last byte left), decode on its decode node."""
    info: tuple[tuple[str, int | float | str | bool], ...] = (
        ("prompt_tokens", req.num_prompt), ("cached_tokens", req.num_cached),
        ("output_tokens", req.num_output), ("arrival_s", req.arrival_s),
        ("queueing_s", req.prefill_start_s - req.arrival_s),
        ("ttft_s", req.kv_ready_s - req.arrival_s),
    )  # fmt: skip
    spans = [
        Span(NODE_TRACK + req.prefill_node, "prefill", req.index, req.prefill_start_s,
             req.prefill_end_s, info),
    ]  # fmt: skip
    if req.transfer_bytes:
        src = site_of.get(req.prefill_node, "?")
        dst = site_of.get(req.decode_node, "?")
        spans.append(
            Span(f"{LINK_TRACK}{src}->{dst}", "transfer", req.index, req.prefill_start_s,
                 req.kv_ready_s, (("bytes", req.transfer_bytes), *info))
        )  # fmt: skip
    spans.append(
        Span(NODE_TRACK + req.decode_node, "decode", req.index, req.decode_start_s, req.finish_s,
             (("kv_wait_s", req.decode_start_s - req.kv_ready_s), *info))
    )  # fmt: skip
    return spans


class TraceLog:
    """Collects every finished request's spans (``on_finish`` hook); ``site_of``: node -> site."""

    def __init__(self, site_of: dict[str, str]) -> None:
        self._site_of = site_of
        self.spans: list[Span] = []

    def __call__(self, req: SimRequest) -> None:
        self.spans.extend(sim_spans(req, self._site_of))


def both(*hooks: Callable[[SimRequest], None] | None) -> Callable[[SimRequest], None] | None:
    """One ``on_finish`` hook calling each given one (None when none is given)."""
    given = [h for h in hooks if h is not None]
    if not given:
        return None

    def call(req: SimRequest) -> None:
        for h in given:
            h(req)

    return call


def _track_order(track: str) -> tuple[int, str]:
    kind = 0 if track.startswith(NODE_TRACK) else 1 if track.startswith(LINK_TRACK) else 2
    return kind, track


def _lanes(spans: Sequence[Span]) -> list[int]:
    """Per span (sorted by start), the lowest lane free at its start (interval partitioning:
    as many lanes as the most spans overlapping at one instant)."""
    free: list[int] = []  # lanes whose last span has ended, as a heap
    busy: list[tuple[float, int]] = []  # (end, lane) of lanes in use, as a heap
    num_lanes = 0
    out = []
    for s in spans:
        while busy and busy[0][0] <= s.start_s:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, num_lanes = num_lanes, num_lanes + 1
        heapq.heappush(busy, (max(s.start_s, s.end_s), lane))
        out.append(lane)
    return out


def build_trace(spans: Iterable[Span], title: str = "prfaas") -> dict[str, Any]:
    """The Chrome trace-event object: ``{"traceEvents": [...], ...}``. Per track a
    ``process_name`` and ``process_sort_index`` metadata event, per lane a ``thread_name``, then
    one complete event (``ph: "X"``, ``ts``/``dur`` in microseconds) per span, in time order within
    each lane. Spans that end before they start (a clock step) are kept with ``dur`` 0."""
    by_track: dict[str, list[Span]] = {}
    for s in spans:
        by_track.setdefault(s.track, []).append(s)
    events: list[dict[str, Any]] = []
    for pid, track in enumerate(sorted(by_track, key=_track_order), start=1):
        items = sorted(by_track[track], key=lambda s: (s.start_s, s.end_s, s.request))
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": track}})  # fmt: skip
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})  # fmt: skip
        lanes = _lanes(items)
        for lane in sorted(set(lanes)):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": lane + 1,
                           "args": {"name": f"lane {lane}"}})  # fmt: skip
        timed = []
        for s, lane in zip(items, lanes, strict=True):
            ts = s.start_s * US_PER_S
            timed.append({
                "ph": "X", "name": s.name, "cat": s.category, "pid": pid, "tid": lane + 1,
                "ts": round(ts, 3), "dur": round(max(0.0, s.end_s * US_PER_S - ts), 3),
                "args": {"request": s.request, **dict(s.args)},
            })  # fmt: skip
        timed.sort(key=lambda e: (e["tid"], e["ts"]))
        events.extend(timed)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}
