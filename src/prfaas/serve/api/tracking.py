"""``RequestTracker``: one request's timeline (arrival, first and last token) and its metrics.

Every exit path calls ``finish(status)``; only the first call records, so a stream that ends, fails
and is then torn down is counted once. Status 499 means the client went away (nginx's convention).
"""

from __future__ import annotations

import time

from prfaas.serve.api.metrics import GatewayMetrics

CLIENT_GONE = 499


class RequestTracker:
    __slots__ = (
        "_metrics",
        "arrival_s",
        "endpoint",
        "first_token_s",
        "last_token_s",
        "num_tokens",
        "stage",
        "status",
    )  # fmt: skip

    def __init__(self, metrics: GatewayMetrics, endpoint: str) -> None:
        self._metrics = metrics
        self.endpoint = endpoint
        self.arrival_s = time.monotonic()
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.num_tokens = 0
        self.status: int | None = None
        self.stage = "parsing"
        """parsing -> queued -> waiting_first_token -> streaming: where a leaving client left."""

    def on_tokens(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        now = time.monotonic()
        m = self._metrics
        if self.first_token_s is None:
            self.first_token_s = now
            m.ttft_seconds.observe(now - self.arrival_s)
            # Tokens that arrive with the first one follow it with no gap.
            for _ in range(num_tokens - 1):
                m.inter_token_seconds.observe(0.0)
        else:
            # Several tokens in one event share its gap evenly (one observation per token).
            assert self.last_token_s is not None
            per_token_s = (now - self.last_token_s) / num_tokens
            for _ in range(num_tokens):
                m.inter_token_seconds.observe(per_token_s)
        self.last_token_s = now
        self.num_tokens += num_tokens
        m.generation_tokens.inc(num_tokens)

    def finish(self, status: int) -> None:
        if self.status is not None:
            return
        self.status = status
        m = self._metrics
        m.requests.labels(endpoint=self.endpoint, status=str(status)).inc()
        if status == CLIENT_GONE:
            m.cancelled.labels(stage=self.stage).inc()
        if status != 200 or self.first_token_s is None or self.last_token_s is None:
            return
        m.request_latency_seconds.observe(self.last_token_s - self.arrival_s)
        if self.num_tokens > 1:
            m.time_per_output_token_seconds.observe(
                (self.last_token_s - self.first_token_s) / (self.num_tokens - 1)
            )
