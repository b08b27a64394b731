"""``create_gateway_app``: the FastAPI app of the gateway's OpenAI-compatible HTTP surface.

Flow of a generation request: read + validate (4xx; unknown fields dropped and logged once) ->
admit (429 + Retry-After when the bounded queue is full, before the backend is touched) -> relay
the backend's tokens (JSON, or SSE chunks then ``data: [DONE]``). Admission, relay and answer run
inside one ``Gateway.session`` (an async context manager owning the slot and the backend's
generator), so every exit path releases both. The client leaving at any point cancels the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from prfaas.serve.api.admission import Overloaded, Permit
from prfaas.serve.api.api_keys import ApiKeyMiddleware
from prfaas.serve.api.config import GatewayHTTPConfig
from prfaas.serve.api.disconnect import ClientGone, until_disconnect
from prfaas.serve.api.errors import ApiError, error_response, overloaded
from prfaas.serve.api.formats import DONE, Format, sse, usage
from prfaas.serve.api.health import add_info_routes
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.api.prepare import Prepared, prepare, read_json
from prfaas.serve.api.relay import Delta, Relay
from prfaas.serve.api.state import GatewayState, UnknownFields
from prfaas.serve.api.tokenization import add_tokenizer_routes
from prfaas.serve.api.tokenizer import Tokenizer
from prfaas.serve.api.tracking import CLIENT_GONE, RequestTracker
from prfaas.serve.backend import Backend

log = logging.getLogger("prfaas.serve.api")

__all__ = ["Gateway", "UnknownFields", "create_gateway_app", "error_response"]


SEND_GRACE_S = 1.0
"""How long past its deadline a stream may still be blocked sending before it is cut off."""


class Gateway(GatewayState):
    """The generation endpoints' handling over the shared parts (``state.GatewayState``)."""

    async def handle(self, request: Request, *, chat: bool) -> Response:
        """Parse and validate; the returned response does the rest (``_GenerationResponse``)."""
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
        except ApiError as exc:
            tracker.finish(exc.status)
            return error_response(exc)
        except ClientDisconnect:
            tracker.finish(CLIENT_GONE)
            return Response(status_code=CLIENT_GONE)
        self.unknown_fields.note(request.url.path, prepared.unknown_fields)
        return _GenerationResponse(self, prepared, tracker)

    @contextlib.asynccontextmanager
    async def session(
        self, prepared: Prepared, tracker: RequestTracker, receive: Receive
    ) -> AsyncIterator[Relay]:
        """Everything one generation holds, from admission to its last byte: an admission slot
        and the relay running the backend's generator. Entering waits for the slot (an 429
        ``ApiError``, or ``ClientGone`` if the client leaves meanwhile); leaving, however it
        happens (done, failed, deadline, client gone, cancelled), closes the relay, which closes
        the backend's generator, then gives the slot back."""
        tracker.stage = "queued"
        permit = await until_disconnect(receive, self._admit())
        try:
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
            try:
                yield relay
            finally:
                await relay.close()
        finally:
            permit.release()  # also when relay.close() was cancelled at its await

    async def _admit(self) -> Permit:
        try:
            timeout_s = min(self.config.queue_timeout_s, self.config.request_timeout_s)
            return await self.admission.acquire(timeout_s)
        except Overloaded as exc:
            self.metrics.rejected.labels(reason=exc.reason).inc()
            raise overloaded(str(exc), self.config.retry_after_s) from None


def _usage(prepared: Prepared, relay: Relay, num_completion_tokens: int) -> dict[str, Any]:
    return usage(len(prepared.req.prompt_token_ids), num_completion_tokens, relay.num_cached_tokens)


class _GenerationResponse(Response):
    """One admitted generation, run as the response Starlette sends: admission, the backend's
    tokens and the answer (JSON, or SSE chunks then ``data: [DONE]``) all happen inside one
    ``Gateway.session``, so no exit path can keep a slot or leave the backend running.

    A streaming request waits for its first token before answering 200, so a failure before
    any token keeps its HTTP status; a failure after that ends the stream with an error event.
    Errors are answered after the session is left (the slot is free before a slow client reads).
    """

    def __init__(self, gateway: Gateway, prepared: Prepared, tracker: RequestTracker) -> None:
        super().__init__()
        self._gateway = gateway
        self._prepared = prepared
        self._tracker = tracker
        self._streaming = False
        self._fmt = Format(
            prepared.chat,
            prepared.req.request_id,
            prepared.model,
            prepared.return_token_ids,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracker = self._tracker
        answer: Response | None
        try:
            answer = await self._generate(scope, receive, send)
        except ApiError as exc:
            tracker.finish(exc.status)
            answer = error_response(exc)
        except (ClientGone, ClientDisconnect):
            # Nobody reads it; it ends the exchange unless the stream had started it.
            answer = None if self._streaming else Response(status_code=CLIENT_GONE)
        finally:
            tracker.finish(CLIENT_GONE)  # a no-op unless the client left or we were cancelled
        if answer is not None:
            await answer(scope, receive, send)
        if self.background is not None:  # FastAPI may attach (empty) background tasks
            await self.background()

    async def _generate(self, scope: Scope, receive: Receive, send: Send) -> Response | None:
        prepared, tracker = self._prepared, self._tracker
        async with self._gateway.session(prepared, tracker, receive) as relay:
            if not prepared.stream:
                body = await until_disconnect(receive, self._collect(relay))
                tracker.finish(200)
                return JSONResponse(body)
            first = await until_disconnect(receive, relay.next())
            tracker.stage = "streaming"
            chunks = self._sse(relay, first)
            stream = StreamingResponse(
                chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
            # Token waits honour the deadline already; this bounds the waits on `send` when
            # the client stops reading.
            remaining_s = relay.deadline_s + SEND_GRACE_S - time.monotonic()
            self._streaming = True
            try:
                async with asyncio.timeout(max(remaining_s, 0.0)):
                    await stream(scope, receive, send)
            except TimeoutError:
                pass  # uvicorn closes a response the app left unfinished
            finally:
                await chunks.aclose()
            return None

    async def _collect(self, relay: Relay) -> dict[str, Any]:
        parts: list[str] = []
        finish = "stop"
        async for delta in relay.deltas():
            parts.append(delta.text)
            finish = delta.finish_reason or finish
        text = "".join(parts)
        return self._fmt.full(
            text, relay.token_ids, finish, _usage(self._prepared, relay, relay.num_tokens)
        )

    async def _sse(self, relay: Relay, first: Delta | None) -> AsyncGenerator[bytes, None]:
        fmt, prepared, tracker = self._fmt, self._prepared, self._tracker
        every = prepared.continuous_usage
        try:
            opening = fmt.opening(_usage(prepared, relay, 0) if every else None)
            if first is None:  # the backend ended at once without a token
                yield opening
            else:
                yield opening + fmt.chunk(
                    first, _usage(prepared, relay, relay.num_tokens) if every else None
                )
            async for delta in relay.deltas():
                yield fmt.chunk(delta, _usage(prepared, relay, relay.num_tokens) if every else None)
            if prepared.include_usage:
                yield fmt.usage_chunk(_usage(prepared, relay, relay.num_tokens))
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
    add_tokenizer_routes(app, gateway)
    if gateway.config.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=gateway.config.api_keys)

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
