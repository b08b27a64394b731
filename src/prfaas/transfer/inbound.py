"""``InboundSession`` (one request's KV arriving, the consumer's handle) and ``Delivery``.

The consumer awaits ``layer(i)`` (every byte of layer i MAC-verified) or ``complete()`` (the
whole session verified: coverage, chunk count, digest), or cancels with ``abort(reason)``. The
``Receiver`` (``receiver.py``) feeds it; ``_Peer`` groups one sender's connections and sessions.
asyncio; no policy.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from prfaas.transfer.assembly import Assembly
from prfaas.transfer.channel import Channel
from prfaas.transfer.config import TransferConfig
from prfaas.transfer.errors import AbortCode, SessionAborted
from prfaas.transfer.manifest import Manifest
from prfaas.transfer.session_state import SessionState
from prfaas.transfer.waiting import Signal, wait_until

_KEEP_FINISHED = 4096  # ids of finished sessions remembered per sender, to drop late chunks


@dataclass(frozen=True, slots=True)
class Delivery:
    """A verified session: the consumer's own buffers, now holding every byte of the manifest."""

    request_id: str
    manifest: Manifest
    buffers: tuple[memoryview, ...]
    first_token: int


class SessionOwner(Protocol):
    """What a session needs of the ``Receiver`` that feeds it: a protocol, so that this module
    does not import ``receiver.py`` (which imports this one)."""

    config: TransferConfig

    def _abort(self, s: InboundSession, err: SessionAborted, tell_peer: bool) -> None: ...


class InboundSession:
    """One request's KV arriving. ``await layer(i)``, ``await complete()``, ``abort(reason)``."""

    def __init__(self, receiver: SessionOwner, peer: _Peer, session_id: int, manifest: Manifest):
        self.receiver = receiver
        self.session_id = session_id
        self.manifest = manifest
        self.request_id = manifest.request_id
        self.assembly = Assembly(session_id, manifest)
        self.error: SessionAborted | None = None
        self.progress_at_s = asyncio.get_running_loop().time()
        self._peer = peer
        self._signal = Signal()
        self._delivery: Delivery | None = None
        self._acked_bytes = 0
        self._ack_timer: asyncio.TimerHandle | None = None

    @property
    def state(self) -> SessionState:
        return self.assembly.state

    async def layer(self, index: int, timeout_s: float | None = None) -> memoryview:
        """Layer ``index``'s buffer once every byte of it is MAC-verified (the session digest
        is checked only by ``complete``)."""
        if not 0 <= index < self.manifest.num_layers:
            raise IndexError(f"layer {index} not in 0..{self.manifest.num_layers - 1}")
        await wait_until(
            self._signal,
            lambda: self.error is None and self.assembly.layer_full(index),
            lambda: self.error,
            timeout_s or self.receiver.config.timeout_s,
            f"layer {index} of request {self.request_id}",
        )
        return self.assembly.buffers[index]

    async def complete(self, timeout_s: float | None = None) -> Delivery:
        """The verified session. Raises SessionAborted (with the reason) if it failed."""
        await wait_until(
            self._signal,
            lambda: self._delivery is not None,
            lambda: self.error,
            timeout_s or self.receiver.config.timeout_s,
            f"request {self.request_id}",
        )
        assert self._delivery is not None
        return self._delivery

    def abort(self, reason: str, code: AbortCode = AbortCode.CANCELLED) -> None:
        """Receiver-side cancel: the sender is told; the buffers are no longer written."""
        self.receiver._abort(self, SessionAborted(code, reason), tell_peer=True)

    async def __aenter__(self) -> InboundSession:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.error is None and self._delivery is None:
            self.abort("consumer closed the session" if e is None else f"consumer failed: {e!r}")

    # -- engine side --------------------------------------------------------------------------
    def _changed(self) -> None:
        self._signal.fire()

    def _verified(self) -> None:
        a = self.assembly
        self._delivery = Delivery(self.request_id, self.manifest, a.buffers, a.first_token)
        self._changed()


class _Peer:
    """One sender (by its peer id): its connections, its live sessions, and the ids of finished
    ones (only ids: a finished session's buffers belong to the consumer alone)."""

    def __init__(self, peer_id: bytes) -> None:
        self.peer_id = peer_id
        self.channels: list[Channel] = []
        self.sessions: dict[int, InboundSession] = {}
        self.finished: OrderedDict[int, None] = OrderedDict()

    def retire(self, s: InboundSession) -> None:
        self.sessions.pop(s.session_id, None)
        self.finished[s.session_id] = None
        while len(self.finished) > _KEEP_FINISHED:
            self.finished.popitem(last=False)
