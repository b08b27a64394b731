"""``prfaas bench``'s per-request export: each request's client timings joined with what the
gateway's route log (``GET /internal/routes``, one ``RouteRecord`` per prefilled request) says
happened to it, as ``workload.request_columns.RequestRow`` (the columns ``prfaas sim
--requests-csv`` writes) and as ``sim.perfetto`` spans.

Records are matched to requests by prompt digest (the gateway's ``prompt_digest`` of the token
ids it received, which equal the ids the client sent with ``prompt_format="tokens"``); equal
prompts are matched first sent, first logged. Text prompts are tokenised by the server, so their
ids are unknown here and their rows carry no route. Without a record (no route log given, a log
that dropped its oldest entries, a request that failed before its prefill) the route columns are
empty. The live client cannot see queueing or the KV transfer: ``queueing_s`` is empty, and a
request's first span runs from its send to its first token. Pure (no I/O).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from prfaas.serve.gateway.hashing import prompt_digest
from prfaas.serve.loadgen.client import RequestResult
from prfaas.serve.loadgen.workload import BenchRequest, PromptSynth
from prfaas.sim.perfetto import NODE_TRACK, Span
from prfaas.workload.request_columns import OK, RequestRow

UNROUTED_TRACK = "endpoint"
"""The track of requests whose node is unknown (no route record)."""


def match_routes(
    requests: Sequence[BenchRequest],
    results: Sequence[RequestResult],
    routes: Sequence[Mapping[str, Any]],
    synth: PromptSynth,
) -> dict[int, Mapping[str, Any]]:
    """Request index -> its route record (only the requests a record was found for)."""
    if synth.prompt_format != "tokens":
        return {}
    by_digest: dict[str, deque[Mapping[str, Any]]] = {}
    for r in routes:  # the log is oldest first
        by_digest.setdefault(str(r.get("prompt_digest", "")), deque()).append(r)
    by_index = {req.index: req for req in requests}
    out: dict[int, Mapping[str, Any]] = {}
    for res in sorted(results, key=lambda r: (r.sent_s, r.index)):
        req = by_index.get(res.index)
        if req is None:
            continue
        found = by_digest.get(prompt_digest(synth.token_ids(req)))
        if found:
            out[res.index] = found.popleft()
    return out


def request_rows(
    results: Sequence[RequestResult], routes: Mapping[int, Mapping[str, Any]]
) -> list[RequestRow]:
    """One row per request sent (failed ones too, with their reason as ``outcome``), in index
    order."""
    rows = []
    for res in sorted(results, key=lambda r: r.index):
        route = routes.get(res.index)
        cached: int | None = None
        site = prefill = decode = None
        offloaded = rerouted = None
        crossed: int | None = None
        hit: float | None = None
        if route is not None:
            cached = int(route["num_cached_tokens"])
            site, prefill = str(route["prefill_site"]), str(route["prefill_node"])
            decode = str(route["decode_node"])
            offloaded = bool(route["offloaded"])
            rerouted = int(route.get("attempts", 1)) > 1
            # kv_bytes is what the prefill node sent: across the link only when offloaded.
            crossed = int(route["kv_bytes"]) if offloaded else 0
            looked = int(route["num_prompt_tokens"])
            hit = cached / looked if looked else 0.0
        rows.append(
            RequestRow(
                res.index, res.sent_s, res.num_prompt_tokens, cached, res.num_output_tokens,
                site, prefill, decode, offloaded, rerouted, None, res.ttft_s, res.latency_s,
                crossed, hit, OK if res.ok else str(res.reason),
            )
        )  # fmt: skip
    return rows


def live_spans(rows: Sequence[RequestRow]) -> list[Span]:
    """Per completed request: send to first token on its prefill node (queueing, prefill and
    the KV transfer, which the client cannot tell apart), then first to last token on its
    decode node; requests without a route on one ``endpoint`` track."""
    spans = []
    for row in rows:
        if row.outcome != OK or row.ttft_s is None or row.e2e_s is None:
            continue
        info: tuple[tuple[str, int | float | str | bool], ...] = (
            ("prompt_tokens", row.num_prompt_tokens),
            ("output_tokens", row.num_output_tokens),
            ("ttft_s", row.ttft_s),
        )
        if row.num_cached_tokens is not None:
            info += (("cached_tokens", row.num_cached_tokens),)
        if row.cross_site_bytes:
            info += (("cross_site_bytes", row.cross_site_bytes),)
        first = NODE_TRACK + row.prefill_node if row.prefill_node else UNROUTED_TRACK
        last = NODE_TRACK + row.decode_node if row.decode_node else UNROUTED_TRACK
        t0, t1, t2 = row.arrival_s, row.arrival_s + row.ttft_s, row.arrival_s + row.e2e_s
        spans.append(Span(first, "to_first_token", row.index, t0, t1, info))
        spans.append(Span(last, "decode", row.index, t1, t2, info))
    return spans
