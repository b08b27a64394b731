"""``GatewayMetrics``: every Prometheus metric the gateway exposes on ``GET /metrics``.

One object per gateway, with its own ``CollectorRegistry`` (two gateways in one process, as in
tests, do not collide). The HTTP surface fills the request metrics itself; the dispatcher, control
plane and transfer engine only call ``.labels(...).inc()`` / ``.set()`` on the objects below
(docs/api.md lists them with their labels). Names carry units (``_seconds``, ``_bytes``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# TTFT spans a few ms (cache hit, short prompt) to minutes (128K-token prefill behind a queue).
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
TOKEN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1, 2.5)
LATENCY_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class GatewayMetrics:
    def __init__(self, namespace: str = "prfaas") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, ns = self.registry, namespace

        # --- filled by serve.api -------------------------------------------------------------
        self.requests = Counter(
            "requests", "Finished HTTP requests by endpoint and status code",
            ["endpoint", "status"], namespace=ns, registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            "rejected", "Requests refused with 429 before reaching the backend, by reason",
            ["reason"], namespace=ns, registry=r,
        )  # fmt: skip
        self.ttft_seconds = Histogram(
            "ttft_seconds", "Arrival to first generated token", namespace=ns, registry=r,
            buckets=TTFT_BUCKETS_S,
        )  # fmt: skip
        self.inter_token_seconds = Histogram(
            "inter_token_seconds", "Gap between successive generated tokens (per token)",
            namespace=ns, registry=r, buckets=TOKEN_BUCKETS_S,
        )  # fmt: skip
        self.time_per_output_token_seconds = Histogram(
            "time_per_output_token_seconds",
            "Per request: (last token - first token) / (tokens - 1)",
            namespace=ns, registry=r, buckets=TOKEN_BUCKETS_S,
        )  # fmt: skip
        self.request_latency_seconds = Histogram(
            "request_latency_seconds", "Arrival to last token of a completed request",
            namespace=ns, registry=r, buckets=LATENCY_BUCKETS_S,
        )  # fmt: skip
        self.request_state_seconds = Histogram(
            "request_state_seconds",
            "Seconds a request spent in each state it left at the gateway (queued: admitted to "
            "routed; routed: the decode node's ready and any cache move; prefilling: the prefill "
            "call to the prefill's answer or the first token; transferring: the prefill's answer "
            "to the first token; decoding: the first token to the last); a retried request "
            "counts each attempt",
            ["state"], namespace=ns, registry=r, buckets=TTFT_BUCKETS_S,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "prompt_tokens", "Prompt tokens of admitted requests", namespace=ns, registry=r
        )
        self.generation_tokens = Counter(
            "generation_tokens", "Tokens sent to clients", namespace=ns, registry=r
        )
        self.in_flight = Gauge(
            "in_flight_requests", "Requests holding an admission slot", namespace=ns, registry=r
        )
        self.queued = Gauge(
            "queued_requests", "Requests waiting for an admission slot", namespace=ns, registry=r
        )
        self.cancelled = Counter(
            "cancelled", "Requests whose client went away before the end, by stage",
            ["stage"], namespace=ns, registry=r,
        )  # fmt: skip

        # --- for the dispatcher / control plane / transfer engine (the lead) ------------------
        self.route_decisions = Counter(
            "route_decisions", "Router decisions by prefill target and reason",
            ["target", "reason"], namespace=ns, registry=r,
        )  # fmt: skip
        self.cross_site_bytes = Counter(
            "cross_site_bytes", "KV bytes sent between sites", ["src_site", "dst_site"],
            namespace=ns, registry=r,
        )  # fmt: skip
        self.kv_recomputed = Counter(
            "kv_recomputed", "Requests whose decode node could not use the KV sent to it and "
            "recomputed the prompt", ["decode_node"], namespace=ns, registry=r,
        )  # fmt: skip
        self.cross_site_goodput_bytes_per_s = Gauge(
            "cross_site_goodput_bytes_per_s", "Measured KV goodput on an inter-site link",
            ["link"], namespace=ns, registry=r,
        )  # fmt: skip
        self.link_utilisation = Gauge(
            "link_utilisation", "Fraction of the link's rate in use (0..1)", ["link"],
            namespace=ns, registry=r,
        )  # fmt: skip
        self.link_backlog_bytes = Gauge(
            "link_backlog_bytes", "Bytes queued for a link", ["link"], namespace=ns, registry=r
        )
        self.link_rtt_seconds = Gauge(
            "link_rtt_seconds", "Smoothed RTT of a link", ["link"], namespace=ns, registry=r
        )
        self.link_congested = Gauge(
            "link_congested", "1 if the monitor flags the link congested", ["link"],
            namespace=ns, registry=r,
        )  # fmt: skip
        self.prefix_lookup_tokens = Counter(
            "prefix_lookup_tokens", "Prompt tokens looked up in a site's prefix cache", ["site"],
            namespace=ns, registry=r,
        )  # fmt: skip
        self.prefix_hit_tokens = Counter(
            "prefix_hit_tokens", "Prompt tokens found cached at a site", ["site"],
            namespace=ns, registry=r,
        )  # fmt: skip
        self.prefix_hit_rate = Gauge(
            "prefix_hit_rate", "hit tokens / looked-up tokens at a site (recent window)",
            ["site"], namespace=ns, registry=r,
        )  # fmt: skip
        self.stage_queue_depth = Gauge(
            "stage_queue_depth", "Requests waiting at a stage of a node",
            ["stage", "node"], namespace=ns, registry=r,
        )  # fmt: skip
        self.nodes = Gauge(
            "nodes", "Registered nodes by site, role and state", ["site", "role", "state"],
            namespace=ns, registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "retries", "Requests re-dispatched after a failure, by reason", ["reason"],
            namespace=ns, registry=r,
        )  # fmt: skip

    def observe_prefix_lookup(self, site: str, lookup_tokens: int, hit_tokens: int) -> None:
        """Convenience for the dispatcher: count one lookup at ``site``."""
        self.prefix_lookup_tokens.labels(site=site).inc(lookup_tokens)
        self.prefix_hit_tokens.labels(site=site).inc(hit_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
