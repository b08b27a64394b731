"""The Endpoint Picker's gRPC side: Envoy's ``ExternalProcessor`` (a bidirectional stream per
HTTP request) and the gRPC health services (``liveness``: the process serves; ``readiness``: some
decode node is in rotation; ``""``: both), on the ext_proc port and on a health port of their own.

Per stream: the request headers are answered at once (go on) unless the request has no body; the
decision is made on the body (Envoy buffers it: ``request_body_mode: BUFFERED``) and answered with
the destination header, or an immediate 4xx/5xx. ``run_epp`` runs it beside the gateway's two
listeners in one event loop, so that nodes register and heartbeat here as they do at a gateway."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from prfaas.serve.epp import protocol
from prfaas.serve.epp.picker import EndpointPicker, Pick, Refused

log = logging.getLogger("prfaas.epp")

READINESS_PERIOD_S = 0.5
SERVICES = ("", "liveness", "readiness")


class _Processor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, picker: EndpointPicker) -> None:
        self.picker = picker
        self.num_picked = 0
        self.num_refused = 0

    def _decide(
        self, path: str, body: bytes, subset: frozenset[str] | None, with_body: bool
    ) -> tuple[ep.ProcessingResponse, Pick | None]:
        try:
            pick = self.picker.pick(path, body, subset)
        except Refused as exc:
            self.num_refused += 1
            retry = 1 if exc.status == 429 else None
            answer = protocol.immediate(exc.status, exc.message, exc.error_type, exc.code, retry)
            return answer, None
        self.num_picked += 1
        self.picker.hold(pick)
        return self._answer(pick, with_body), pick

    @staticmethod
    def _answer(pick: Pick, with_body: bool) -> ep.ProcessingResponse:
        if with_body:
            return protocol.route(pick.endpoints, pick.headers)
        return protocol.route_headers_only(pick.endpoints, pick.headers)

    async def Process(
        self, request_iterator: AsyncIterator[ep.ProcessingRequest], context: Any
    ) -> AsyncIterator[ep.ProcessingResponse]:
        held: Pick | None = None
        try:
            async for response in self._exchange(request_iterator):
                if isinstance(response, Pick):
                    held = response
                    continue
                yield response
        finally:
            # Envoy ends the stream when the HTTP exchange ends (measured with 1.40: after the
            # response's last byte, even with response processing off): the request no longer
            # counts against the nodes, as the gateway's own count drops it when it ends.
            if held is not None:
                self.picker.release(held)

    async def _exchange(
        self, request_iterator: AsyncIterator[ep.ProcessingRequest]
    ) -> AsyncIterator[ep.ProcessingResponse | Pick]:
        path = ""
        subset: frozenset[str] | None = None
        body = bytearray()
        async for request in request_iterator:
            which = request.WhichOneof("request")
            if which == "request_headers":
                headers = protocol.header_map(request.request_headers.headers)
                path = headers.get(":path", "")
                subset = protocol.subset_hint(request)
                if request.request_headers.end_of_stream:
                    answer, pick = self._decide(path, b"", subset, with_body=False)
                    if pick is not None:
                        yield pick
                    yield answer
                else:
                    yield protocol.continue_headers()
            elif which == "request_body":
                body += request.request_body.body
                if request.request_body.end_of_stream:
                    hint = protocol.subset_hint(request)
                    answer, pick = self._decide(path, bytes(body), hint or subset, True)
                    if pick is not None:
                        yield pick
                    yield answer
                else:
                    yield ep.ProcessingResponse(request_body=ep.BodyResponse())
            elif which == "request_trailers":
                yield ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
            elif which == "response_headers":
                yield ep.ProcessingResponse(response_headers=ep.HeadersResponse())
            elif which == "response_body":
                yield ep.ProcessingResponse(response_body=ep.BodyResponse())
            elif which == "response_trailers":
                yield ep.ProcessingResponse(response_trailers=ep.TrailersResponse())


class EppServer:
    """The ext_proc and health services on ``host:grpc_port`` (and ``health_port`` if given)."""

    def __init__(self, picker: EndpointPicker) -> None:
        self.picker = picker
        self.processor = _Processor(picker)
        self.health = health.aio.HealthServicer()
        self._servers: list[Any] = []
        self._ready_task: asyncio.Task[None] | None = None
        self.ports: list[int] = []

    async def start(self, host: str, grpc_port: int, health_port: int | None = None) -> None:
        main = grpc.aio.server()
        ep_grpc.add_ExternalProcessorServicer_to_server(self.processor, main)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, main)
        self.ports.append(main.add_insecure_port(f"{host}:{grpc_port}"))
        self._servers.append(main)
        if health_port is not None:
            side = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, side)
            self.ports.append(side.add_insecure_port(f"{host}:{health_port}"))
            self._servers.append(side)
        await self.health.set("liveness", health_pb2.HealthCheckResponse.SERVING)
        await self._set_ready()
        for server in self._servers:
            await server.start()
        self._ready_task = asyncio.create_task(self._watch_ready())

    def ready(self) -> bool:
        return bool(self.picker._decode_candidates(None))

    async def _set_ready(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set("readiness", status)
        await self.health.set("", status)

    async def _watch_ready(self) -> None:
        while True:
            await asyncio.sleep(READINESS_PERIOD_S)
            await self._set_ready()

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._ready_task is not None:
            self._ready_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ready_task
        for server in self._servers:
            await server.stop(grace_s)
        self._servers.clear()
