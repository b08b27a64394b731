"""``Relay``: runs one backend generation in its own task and hands its output out as text deltas.

The pump task iterates ``backend.generate(req)`` into a bounded queue (a slow client holds back
the backend, never memory). The consumer reads with the request's deadline, applies the
``max_tokens`` cap, detokenizes incrementally, and maps failures to ``ApiError``. ``close()``
cancels the pump, which closes the backend's generator: that is how a client that went away, a
deadline or a cap aborts the request in the backend. ``close()`` is idempotent and every exit
path of the app calls it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from prfaas.serve.api.errors import from_generation_error, internal_error, timeout_error
from prfaas.serve.api.tokenizer import IncrementalDetokenizer, Tokenizer
from prfaas.serve.api.tracking import RequestTracker
from prfaas.serve.backend import Backend, GenerationError, GenerationRequest, TokenEvent

_END = object()
# How long close() waits for the backend's cleanup (its `finally`) before leaving it running.
_CLOSE_GRACE_S = 5.0
_MAX_COALESCED_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None


class Relay:
    def __init__(
        self,
        backend: Backend,
        req: GenerationRequest,
        tokenizer: Tokenizer,
        tracker: RequestTracker,
        *,
        timeout_s: float,
        buffer_events: int,
    ) -> None:
        self._backend = backend
        self.req = req
        self._tracker = tracker
        self._timeout_s = timeout_s
        # The deadline runs from the request's arrival (queueing included), on the monotonic
        # clock asyncio's loop uses too.
        self.deadline_s = tracker.arrival_s + timeout_s
        self._queue: asyncio.Queue[object] = asyncio.Queue(maxsize=buffer_events)
        self._detok = IncrementalDetokenizer(tokenizer)
        self._task: asyncio.Task[None] | None = None
        self._finished = False
        self._pending: object | None = None
        self.num_tokens = 0
        self.token_ids: list[int] = []
        self.num_cached_tokens = 0
        """Prompt tokens served from a prefix cache, as the backend last said (0 until then)."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._pump(), name=f"relay-{self.req.request_id}")

    async def _pump(self) -> None:
        stream: AsyncIterator[TokenEvent] | None = None
        try:
            stream = self._backend.generate(self.req)
            async for event in stream:
                await self._queue.put(event)
            await self._queue.put(_END)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # GenerationError or a backend bug: the consumer reports it
            await self._queue.put(exc)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                # Reaching here by cancellation while the generator sits at a `yield`: this is
                # what raises GeneratorExit inside it, so the backend aborts the request.
                await aclose()

    async def _next_event(self) -> object:
        remaining_s = self.deadline_s - time.monotonic()
        try:
            if remaining_s <= 0:
                raise TimeoutError
            return await asyncio.wait_for(self._queue.get(), remaining_s)
        except TimeoutError:
            raise timeout_error(self._timeout_s) from None

    async def next(self) -> Delta | None:
        """The next delta, or None once finished. Raises ``ApiError`` on failure or deadline."""
        if self._finished:
            return None
        item = self._pending if self._pending is not None else await self._next_event()
        self._pending = None
        if isinstance(item, TokenEvent) and item.finish_reason is None:
            item = self._coalesce(item)
        if isinstance(item, GenerationError):
            await self.close()
            raise from_generation_error(item)
        if isinstance(item, Exception):
            await self.close()
            raise internal_error(item)
        if item is _END:  # the backend stopped without saying why
            item = TokenEvent((), "length" if self.num_tokens >= self.req.max_tokens else "stop")
        assert isinstance(item, TokenEvent)
        if item.num_cached_tokens is not None:
            self.num_cached_tokens = item.num_cached_tokens
        room = self.req.max_tokens - self.num_tokens
        ids = item.token_ids[:room]
        reason = item.finish_reason
        if len(ids) < len(item.token_ids) or (reason is None and len(ids) == room):
            reason = "length"  # enforce the cap even on a backend that overruns it
        self.num_tokens += len(ids)
        self.token_ids.extend(ids)
        self._tracker.on_tokens(len(ids))
        text = self._detok.add(ids)
        if reason is not None:
            text += self._detok.flush()
            self._finished = True
            await self.close()
        return Delta(text, ids, reason)

    def _coalesce(self, event: TokenEvent) -> TokenEvent:
        """Merge the token events already waiting into one, so a client that falls behind gets
        fewer, larger chunks (the cost per chunk, not per token, dominates the relay). Stops at a
        finish, an error or the end, which is kept for the next call."""
        ids = list(event.token_ids)
        reason = None
        cached = event.num_cached_tokens
        merged = False
        while reason is None and len(ids) < _MAX_COALESCED_TOKENS and not self._queue.empty():
            item = self._queue.get_nowait()
            if not isinstance(item, TokenEvent):
                self._pending = item
                break
            merged = True
            ids.extend(item.token_ids)
            reason = item.finish_reason
            if item.num_cached_tokens is not None:
                cached = item.num_cached_tokens
        return TokenEvent(tuple(ids), reason, cached) if merged else event

    async def deltas(self) -> AsyncIterator[Delta]:
        while (delta := await self.next()) is not None:
            yield delta

    async def close(self) -> None:
        task = self._task
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait({task}, timeout=_CLOSE_GRACE_S)
