"""``run_epp``: the picker process. It is a gateway (``serve.gateway.app``: the registry the nodes
register and heartbeat with, the KV mirror, the control loop, ``/metrics``) whose routing answer
goes to Envoy through ``ext_proc`` instead of being carried out by its own dispatcher."""

from __future__ import annotations

import asyncio
import os

from prfaas.config import DeploymentConfig
from prfaas.serve.api import GatewayHTTPConfig
from prfaas.serve.api.api_keys import resolve_api_keys
from prfaas.serve.control_tls import control_tls
from prfaas.serve.epp.picker import EndpointPicker
from prfaas.serve.epp.server import EppServer
from prfaas.serve.listeners import PortRouter, bind, serve


def http_config(d: DeploymentConfig) -> GatewayHTTPConfig:
    """The admission limits and deadlines the gateway itself would apply (``gateway.*``)."""
    g = d.gateway
    return GatewayHTTPConfig(
        max_in_flight=g.max_inflight,
        max_queued=g.max_queued,
        request_timeout_s=g.request_timeout_s,
        queue_timeout_s=min(30.0, g.request_timeout_s),
        api_keys=resolve_api_keys(g.api_keys, os.environ),
    )


def run_epp(
    d: DeploymentConfig, grpc_port: int, health_port: int | None, endpoint_port: int | None
) -> None:
    from prfaas.serve.gateway.app import create_cluster_gateway
    from prfaas.serve.run import gateway_tokenizer_and_model

    tokenizer, model = gateway_tokenizer_and_model(d)
    apps = create_cluster_gateway(d, tokenizer, model)
    dispatcher = apps.client.state.dispatcher
    picker = EndpointPicker(
        apps.client.state.registry,
        dispatcher.planner,
        tokenizer,
        model,
        http_config(d),
        endpoint_port,
    )
    g = d.gateway
    client_sock = bind(g.host, g.port)
    control_sock = bind(g.host, g.control_port)
    control_port = control_sock.getsockname()[1]
    router = PortRouter(apps.client, {control_port: apps.control})
    tls = control_tls(d)  # the nodes register over HTTPS with tls.control_plane
    secure = {} if tls is None else {control_port: tls.server}

    async def main() -> None:
        server = EppServer(picker)
        await server.start(g.host, grpc_port, health_port)
        try:
            await serve(router, [client_sock, control_sock], tls=secure)
        finally:
            await server.stop()

    asyncio.run(main())
