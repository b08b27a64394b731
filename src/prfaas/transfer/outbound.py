"""``OutboundSession``: one request's KV on its way out, the producer's handle.

``send`` checks the byte range, cuts it into chunks and queues them on its ``Link`` (a reference to
the producer's memory, not a copy), waiting only for window space; the link's writer tags each
chunk as it writes it (the tag depends on the connection and its position in that connection's
stream). ``finish`` sends END with the session digest and waits for the receiver's COMPLETE. A
timeout aborts the session, and the receiver is told. The link (``sender.py``) does the writing.
asyncio; no policy.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from prfaas.transfer import frames as F
from prfaas.transfer.channel import Channel
from prfaas.transfer.config import TransferConfig
from prfaas.transfer.errors import AbortCode, SessionAborted
from prfaas.transfer.integrity import Ranges, session_digest
from prfaas.transfer.manifest import Manifest
from prfaas.transfer.session_state import SessionState, advance
from prfaas.transfer.waiting import Signal, wait_until


@dataclass(slots=True)
class _Item:
    session: OutboundSession
    chunk: F.Chunk
    view: memoryview


class LinkSide(Protocol):
    """What a session needs of its ``sender.Link``: a protocol, so that this module does not
    import ``sender.py`` (which imports this one)."""

    config: TransferConfig
    _channels: list[Channel]
    _sessions: dict[int, OutboundSession]
    _signal: Signal

    async def open(self, manifest: Manifest) -> OutboundSession: ...
    async def _reserve(self, s: OutboundSession, num_bytes: int) -> None: ...
    def _release(self, s: OutboundSession, num_bytes: int) -> None: ...
    def _enqueue(self, item: _Item) -> None: ...
    async def _write_control(self, ch: Channel, frame: F.Frame) -> None: ...


class OutboundSession:
    """One request's KV on its way out. Use as ``async with link.session(manifest) as s``."""

    def __init__(self, link: LinkSide, session_id: int, manifest: Manifest) -> None:
        self.link = link
        self.session_id = session_id
        self.manifest = manifest
        self.state = SessionState.OPENING
        self.error: SessionAborted | None = None
        self.bytes_queued = 0
        self.bytes_sent = 0
        self.bytes_acked = 0
        self._ranges = Ranges(manifest.layer_bytes())
        self._records: list[tuple[int, int, int]] = []
        self._channel = link._channels[session_id % len(link._channels)]

    # -- producer API -------------------------------------------------------------------------
    async def send(self, layer: int, offset: int, view: object) -> None:
        """Queue bytes ``[offset, offset+len(view))`` of manifest layer ``layer``. The producer must
        not modify ``view``'s memory until ``finish`` returns. ValueError for a bad range;
        SessionAborted if the session died."""
        self._raise_if_dead()
        if self.state is not SessionState.STREAMING:
            raise ValueError(f"send() in session state {self.state.value}")
        data = memoryview(view).cast("B")  # type: ignore[arg-type]
        why = self._ranges.check(layer, offset, len(data))
        if why is not None:
            raise ValueError(f"request {self.manifest.request_id}: {why}")
        self._ranges.claim(layer, offset, len(data))
        step = self.link.config.chunk_bytes
        for start in range(0, len(data), step):
            piece = data[start : start + step]
            try:
                await self.link._reserve(self, len(piece))
            except TimeoutError as exc:
                await self.abort(str(exc), AbortCode.TIMEOUT)
                raise
            chunk = F.Chunk(self.session_id, layer, offset + start, len(piece))
            self._records.append((layer, chunk.offset, chunk.length))
            self.link._enqueue(_Item(self, chunk, piece))

    async def finish(self, first_token: int = -1) -> None:
        """All bytes were sent: send END and wait until the receiver verified the session."""
        self._raise_if_dead()
        missing = self._ranges.missing()
        if missing:
            desc = ", ".join(f"layer {i}: {n} bytes" for i, n in missing[:5])
            raise ValueError(f"request {self.manifest.request_id}: not all sent ({desc})")
        end = F.End(self.session_id, len(self._records), session_digest(self._records), first_token)
        self.state = advance(self.state, SessionState.ENDED)
        try:
            await self.link._write_control(self._channel, end)
            await wait_until(
                self.link._signal,
                lambda: self.state is SessionState.VERIFIED,
                lambda: self.error,
                self.link.config.timeout_s,
                f"COMPLETE of request {self.manifest.request_id}",
            )
        except TimeoutError as exc:  # the receiver is told, so it frees its buffers too
            await self.abort(str(exc), AbortCode.TIMEOUT)
            raise

    async def abort(self, reason: str, code: AbortCode = AbortCode.CANCELLED) -> None:
        """Give up on the session; the receiver is told and frees its buffers."""
        if self.state.terminal:
            return
        self._set_aborted(SessionAborted(code, reason))
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            await self.link._write_control(self._channel, F.Abort(self.session_id, code, reason))

    async def __aenter__(self) -> OutboundSession:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.state.terminal:
            reason = "closed before finish" if e is None else f"producer failed: {e!r}"
            await asyncio.shield(self.abort(reason))

    # -- engine side --------------------------------------------------------------------------
    def _raise_if_dead(self) -> None:
        if self.error is not None:
            raise self.error

    def _set_aborted(self, error: SessionAborted) -> None:
        if self.state.terminal:
            return
        self.state = advance(self.state, SessionState.ABORTED)
        self.error = error
        self.link._release(self, self.bytes_queued - self.bytes_acked)
        self.link._sessions.pop(self.session_id, None)
        self.link._signal.fire()


class OpenSession:
    def __init__(self, link: LinkSide, manifest: Manifest) -> None:
        self._link = link
        self._manifest = manifest
        self._session: OutboundSession | None = None

    async def __aenter__(self) -> OutboundSession:
        self._session = await self._link.open(self._manifest)
        return self._session

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._session is not None
        await self._session.__aexit__(et, e, tb)
