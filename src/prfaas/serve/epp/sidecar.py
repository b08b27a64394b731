"""The decode-side sidecar (``prfaas epp-sidecar``): the OpenAI endpoint the Endpoint Picker
sends a request to. It is the gateway's HTTP surface over the gateway's ``ClusterDispatcher``,
whose planner is pinned by the picker's headers (``pinned.PinnedPlanner``): the prefill runs where
``x-prfaas-prefill-node`` says (or locally after a lost prefill), then the decode on this pod's
node, with the dispatcher's attempts, retries and outcome booking.

Its registry holds the nodes' endpoints as the picker's control listener lists them
(``/internal/endpoints``, signed), refreshed every heartbeat interval: the sidecar takes no
decisions, so it needs where the nodes are, not their loads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import httpx

from prfaas.config import DeploymentConfig
from prfaas.core import MutableClusterView, SiteId, SiteKind
from prfaas.policy import make_router
from prfaas.scenarios import planned_threshold
from prfaas.serve.api import GatewayMetrics, create_gateway_app
from prfaas.serve.auth import SignedAuth
from prfaas.serve.backend import ModelInfo
from prfaas.serve.control_tls import client_options, control_tls
from prfaas.serve.epp.picker import (
    CACHED_TOKENS_HEADER,
    DECODE_NODE_HEADER,
    PREFILL_NODE_HEADER,
)
from prfaas.serve.epp.pinned import ROUTE_PIN, PinnedPlanner, RoutePin
from prfaas.serve.epp.run import http_config
from prfaas.serve.gateway.dispatcher import ClusterDispatcher
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import NodeEndpoint, NodeReport, Registration

log = logging.getLogger("prfaas.epp.sidecar")


class _PinFromHeaders:
    """ASGI middleware: the picker's headers into ``ROUTE_PIN`` for the request's context."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        decode = headers.get(DECODE_NODE_HEADER)
        pin = None
        if decode:
            cached = headers.get(CACHED_TOKENS_HEADER, "0")
            pin = RoutePin(
                decode, headers.get(PREFILL_NODE_HEADER, ""), int(cached) if cached.isdigit() else 0
            )
        token = ROUTE_PIN.set(pin)
        try:
            await self.app(scope, receive, send)
        finally:
            ROUTE_PIN.reset(token)


def register_endpoints(registry: NodeRegistry, rows: list[dict[str, Any]], now_s: float) -> int:
    """Each listed endpoint into ``registry`` as its own process (blank reports); the count."""
    for row in rows:
        ep = NodeEndpoint.model_validate(row)
        blank = NodeReport(node=ep.node, site=ep.site, role=ep.role)
        registry.register(
            Registration(process=f"picker:{ep.node}", nodes=[ep], reports=[blank]), now_s
        )
    return len(rows)


def create_sidecar(
    d: DeploymentConfig, tokenizer: Any, model: ModelInfo, own_nodes: frozenset[str]
) -> tuple[Any, NodeRegistry, ClusterDispatcher]:
    """(the ASGI app, its registry, its dispatcher)."""
    sites = {SiteId(s.name): SiteKind(s.kind) for s in d.sites}
    registry = NodeRegistry(d, MutableClusterView(sites, planned_threshold(d)))
    home = SiteId(d.home_site.name)
    prfaas_sites = [SiteId(s.name) for s in d.sites if s.kind == "prfaas"]
    local = make_router("local_only", home, prfaas_sites)
    metrics = GatewayMetrics()
    dispatcher = ClusterDispatcher(
        registry,
        local,
        local,
        metrics,
        model,
        d.engine.block_tokens,
        route_log_size=d.gateway.route_log_size,
        node_auth=SignedAuth(d.psk.encode()),
    )
    dispatcher.planner = PinnedPlanner(registry, local, metrics, own_nodes)
    app = create_gateway_app(dispatcher, tokenizer, http_config(d), metrics=metrics)
    return _PinFromHeaders(app), registry, dispatcher


async def follow_endpoints(d: DeploymentConfig, registry: NodeRegistry) -> None:
    """Refresh the registry from the picker's control listener until cancelled."""
    url = f"{d.control_url}/internal/endpoints"
    options = client_options(control_tls(d))
    async with httpx.AsyncClient(
        auth=SignedAuth(d.psk.encode()), timeout=5.0, trust_env=False, **options
    ) as client:
        while True:
            try:
                r = await client.get(url)
                r.raise_for_status()
                register_endpoints(registry, r.json(), time.monotonic())
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("endpoints from %s: %s", url, exc)
            await asyncio.sleep(d.heartbeat_interval_s)


def run_sidecar(d: DeploymentConfig, own_nodes: frozenset[str], host: str, port: int) -> None:
    from prfaas.serve.listeners import bind, serve
    from prfaas.serve.run import gateway_tokenizer_and_model

    tokenizer, model = gateway_tokenizer_and_model(d)
    app, registry, dispatcher = create_sidecar(d, tokenizer, model, own_nodes)
    sock = bind(host, port)

    async def main() -> None:
        feed = asyncio.create_task(follow_endpoints(d, registry))
        try:
            await serve(app, [sock])
        finally:
            feed.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feed
            await dispatcher.aclose()

    asyncio.run(main())
