"""``create_gateway_app``: the FastAPI app of the gateway's OpenAI-compatible HTTP surface.

Flow of a generation request: read + validate (4xx) -> admit (429 + Retry-After when the bounded
queue is full, before the backend is touched) -> relay the backend's tokens (JSON, or SSE chunks
then ``data: [DONE]``). A streaming request waits for its first token before answering 200, so a
failure before any token (503 no decode node, 504 deadline) keeps its HTTP status; a failure after
that ends the stream with an error event. The client leaving at any point cancels the backend.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from prfaas.serve.api.admission import Admission, Overloaded, Permit
from prfaas.serve.api.config import GatewayHTTPConfig
from prfaas.serve.api.disconnect import ClientGone, until_disconnect
from prfaas.serve.api.errors import ApiError, overloaded
from prfaas.serve.api.formats import DONE, Format, sse
from prfaas.serve.api.health import add_info_routes
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.api.prepare import Prepared, prepare, read_json
from prfaas.serve.api.relay import Relay
from prfaas.serve.api.tokenizer import Tokenizer
from prfaas.serve.api.tracking import CLIENT_GONE, RequestTracker
from prfaas.serve.backend import Backend


class _StreamWithCleanup(StreamingResponse):
    """A StreamingResponse that runs ``on_close`` however it ends (done, failed, client gone),
    and is cut off ``SEND_GRACE_S`` after the request's deadline even if the client stops
    reading (token waits already honour the deadline; this bounds the waits on ``send``)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[None]],
        deadline_s: float,
    ) -> None:
        headers = {"Cache-Control": "no-cache"}
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._on_close = on_close
        self._deadline_s = deadline_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        remaining_s = self._deadline_s + SEND_GRACE_S - time.monotonic()
        try:
            async with asyncio.timeout(max(remaining_s, 0.0)):
                await super().__call__(scope, receive, send)
        except TimeoutError:
            pass  # uvicorn closes a response the app left unfinished
        finally:
            await self._on_close()


SEND_GRACE_S = 1.0
"""How long past its deadline a stream may still be blocked sending before it is cut off."""


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


class Gateway:
    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        config: GatewayHTTPConfig,
        metrics: GatewayMetrics,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config
        self.metrics = metrics
        self.admission = Admission(config.max_in_flight, config.max_queued)
        metrics.in_flight.set_function(lambda: self.admission.num_in_flight)
        metrics.queued.set_function(lambda: self.admission.num_queued)

    async def handle(self, request: Request, *, chat: bool) -> Response:
        tracker = RequestTracker(self.metrics, "chat" if chat else "completions")
        try:
            body = await read_json(
                request, self.config.max_body_bytes, self.config.request_timeout_s
            )
            prepared = prepare(
                body,
                chat=chat,
                info=self.backend.model_info(),
                tokenizer=self.tokenizer,
                config=self.config,
                arrival_s=tracker.arrival_s,
            )
            tracker.stage = "queued"
            permit = await until_disconnect(request, self._admit())
        except ApiError as exc:
            tracker.finish(exc.status)
            return error_response(exc)
        except (ClientGone, ClientDisconnect):
            tracker.finish(CLIENT_GONE)
            return Response(status_code=CLIENT_GONE)
        self.metrics.prompt_tokens.inc(len(prepared.req.prompt_token_ids))
        tracker.stage = "waiting_first_token"
        relay = Relay(
            self.backend,
            prepared.req,
            self.tokenizer,
            tracker,
            timeout_s=self.config.request_timeout_s,
            buffer_events=self.config.relay_buffer_events,
        )
        relay.start()
        fmt = Format(chat, prepared.req.request_id, prepared.model, prepared.return_token_ids)

        async def cleanup() -> None:
            permit.release()  # first: cleanup may be cancelled at its first await
            await relay.close()
            tracker.finish(tracker.status or CLIENT_GONE)

        try:
            if prepared.stream:
                first = await until_disconnect(request, relay.next())
                tracker.stage = "streaming"
                sse_body = self._sse(relay, first, fmt, prepared, tracker)
                return _StreamWithCleanup(sse_body, cleanup, relay.deadline_s)
            answer = await until_disconnect(request, self._collect(relay, fmt, prepared))
            tracker.finish(200)
            return JSONResponse(answer)
        except ApiError as exc:
            tracker.finish(exc.status)
            await cleanup()
            return error_response(exc)
        except BaseException:  # ClientGone, cancellation, or a bug: never leak the slot or backend
            await cleanup()
            raise

    async def _admit(self) -> Permit:
        try:
            timeout_s = min(self.config.queue_timeout_s, self.config.request_timeout_s)
            return await self.admission.acquire(timeout_s)
        except Overloaded as exc:
            self.metrics.rejected.labels(reason=exc.reason).inc()
            raise overloaded(str(exc), self.config.retry_after_s) from None

    async def _collect(self, relay: Relay, fmt: Format, prepared: Prepared) -> dict[str, Any]:
        parts: list[str] = []
        finish = "stop"
        async for delta in relay.deltas():
            parts.append(delta.text)
            finish = delta.finish_reason or finish
        return fmt.full("".join(parts), relay.token_ids, finish, len(prepared.req.prompt_token_ids))

    async def _sse(
        self, relay: Relay, first: Any, fmt: Format, prepared: Prepared, tracker: RequestTracker
    ) -> AsyncIterator[bytes]:
        try:
            yield fmt.opening() + fmt.chunk(first)
            async for delta in relay.deltas():
                yield fmt.chunk(delta)
            if prepared.include_usage:
                yield fmt.usage_chunk(len(prepared.req.prompt_token_ids), relay.num_tokens)
            tracker.finish(200)
            yield DONE
        except ApiError as exc:
            tracker.finish(exc.status)
            yield sse(exc.body()) + DONE


def create_gateway_app(
    backend: Backend,
    tokenizer: Tokenizer,
    config: GatewayHTTPConfig | None = None,
    *,
    metrics: GatewayMetrics | None = None,
) -> FastAPI:
    """The gateway's HTTP app. ``app.state.gateway`` holds the ``Gateway`` (its ``metrics``,
    ``admission`` and ``config``) for the code that embeds it."""
    gateway = Gateway(
        backend, tokenizer, config or GatewayHTTPConfig(), metrics or GatewayMetrics()
    )
    app = FastAPI(title="prfaas gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await gateway.handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await gateway.handle(request, chat=True)

    add_info_routes(app, gateway)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(
            ApiError(exc.status_code, str(exc.detail), error_type=error_type, code=None)
        )

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> Response:
        message = f"internal error: {type(exc).__name__}: {exc}"
        return error_response(
            ApiError(500, message, error_type="server_error", code="internal_error")
        )

    return app
