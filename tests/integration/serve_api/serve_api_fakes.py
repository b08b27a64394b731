"""Test doubles for the gateway HTTP tests: a deterministic fake backend and a uvicorn server on
127.0.0.1 (random free port, background thread, torn down even when a test fails)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from prfaas.serve.api import ByteTokenizer, GatewayHTTPConfig, create_gateway_app
from prfaas.serve.backend import GenerationError, GenerationRequest, ModelInfo, TokenEvent

MODEL = "fake-model"
MAX_CONTEXT_TOKENS = 512


def expected_tokens(
    prompt: tuple[int, ...], max_tokens: int, stop: tuple[int, ...] = ()
) -> list[int]:
    """The fake model: token k is the letter ('a'..'z') at (len(prompt) + sum(prompt) + k) % 26."""
    out = []
    for k in range(max_tokens):
        token = ord("a") + (len(prompt) + sum(prompt) + k) % 26
        if token in stop:
            break
        out.append(token)
    return out


@dataclass
class FakeBackend:
    """Behaviour is chosen by markers in the prompt text, so one server covers every case:
    ``[slow]`` 50 ms per token; ``[hang]`` never produces a token; ``[503]`` fails before the
    first token; ``[boom]`` raises a plain exception after 2 tokens; ``[gerr]`` raises a
    GenerationError after 2 tokens; ``[overrun]`` ignores max_tokens; ``[cached]`` reports half
    the prompt as a prefix-cache hit on its last event.

    ``open_generators`` counts generators that started and have not ended (their ``finally`` has
    not run): after every request it must be back to 0. ``not_ready`` is what ``ready()`` says."""

    started: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    last_request: GenerationRequest | None = None
    cancelled_event: threading.Event = field(default_factory=threading.Event)
    healthy: bool = True
    open_generators: int = 0
    not_ready: str | None = None

    def model_info(self) -> ModelInfo:
        return ModelInfo(MODEL, MAX_CONTEXT_TOKENS)

    async def health(self) -> dict[str, Any]:
        return {"status": "ok" if self.healthy else "degraded", "nodes": 1}

    async def ready(self) -> str | None:
        return self.not_ready

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        self.started.append(req.request_id)
        self.last_request = req
        text = bytes(t for t in req.prompt_token_ids if t < 256).decode(errors="replace")
        finished = False
        self.open_generators += 1
        cached = len(req.prompt_token_ids) // 2 if "[cached]" in text else None
        try:
            if "[503]" in text:
                raise GenerationError(503, "service_unavailable", "no decode node available")
            if "[hang]" in text:
                await asyncio.sleep(3600)
            limit = req.max_tokens + 5 if "[overrun]" in text else req.max_tokens
            tokens = expected_tokens(req.prompt_token_ids, limit, req.stop_token_ids)
            for k, token in enumerate(tokens):
                if k == 2 and "[boom]" in text:
                    raise RuntimeError("engine exploded")
                if k == 2 and "[gerr]" in text:
                    raise GenerationError(503, "service_unavailable", "decode node lost")
                if "[slow]" in text:
                    await asyncio.sleep(0.05)
                last = k == len(tokens) - 1
                reason = None
                if last and "[overrun]" not in text:
                    reason = "length" if len(tokens) == req.max_tokens else "stop"
                yield TokenEvent((token,), reason, cached if last else None)
            if not tokens:
                yield TokenEvent((), "stop", cached)
            finished = True
            self.completed.append(req.request_id)
        except (GenerationError, RuntimeError):
            finished = True  # a failure, not a cancellation
            raise
        finally:
            self.open_generators -= 1
            if not finished:
                self.cancelled.append(req.request_id)
                self.cancelled_event.set()


@dataclass
class Server:
    url: str
    backend: FakeBackend
    app: Any

    def idle(self) -> tuple[int, int, int]:
        """(admission in flight, admission queued, open backend generators)."""
        admission = self.app.state.gateway.admission
        return admission.num_in_flight, admission.num_queued, self.backend.open_generators

    def wait_idle(self, timeout_s: float = 5.0) -> tuple[int, int, int]:
        """Polls until nothing is held (cleanup runs on the server's thread after the client
        has its answer); returns the last reading, (0, 0, 0) when idle."""
        deadline = time.monotonic() + timeout_s
        while (reading := self.idle()) != (0, 0, 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        return reading

    def wait_cancelled(self, request_id_count: int = 1, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.backend.cancelled) >= request_id_count:
                return True
            time.sleep(0.01)
        return False


def serve(config: GatewayHTTPConfig, tokenizer: Any = None) -> Iterator[Server]:
    backend = FakeBackend()
    app = create_gateway_app(backend, tokenizer or ByteTokenizer(), config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("gateway test server did not start")
            time.sleep(0.01)
        yield Server(f"http://127.0.0.1:{port}", backend, app)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
