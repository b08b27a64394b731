"""``KvEventSubscriber``: the sidecar's subscription to its vLLM server's KV cache events
(``--kv-events-config``: a ZMQ PUB socket and a ROUTER replay socket, both ``ipc://`` in the
sidecar's private temporary folder), kept as a ``BlockTranslator`` the heartbeats report from.

One translator per server lifetime: when the server is ready the subscriber starts a fresh one
(a new journal epoch: the gateway's mirror resets to it) and asks the replay socket for
everything from sequence number 0 (what was published before the subscription took), and again
for what follows the last message after ``IDLE_REPLAY_S`` of silence; when the
server stops being ready or is started again, it starts another, empty one (the dead server's
blocks are gone with it). Messages are applied in sequence order: one already applied (a replay
overlapping the live stream) is skipped; a gap asks the replay socket for the missing ones, and
when it cannot give them (its buffer moved on, no answer) the translator is cleared, which
under-reports until vLLM stores those blocks again but never claims one it lacks. A message
that is not a well-formed event batch (``kv_event_codec.EventDecodeError``) counts as lost
events the same way. Must not import vllm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from typing import Protocol

import zmq
import zmq.asyncio

from prfaas.serve.vllm.block_translator import DEFAULT_MAX_BLOCKS, BlockTranslator
from prfaas.serve.vllm.kv_event_codec import (
    END_SEQ,
    SEQ_BYTES,
    EventDecodeError,
    decode_batch,
    parse_seq,
)
from prfaas.serve.vllm.server import KvEventsEndpoints

log = logging.getLogger("prfaas.vllm")
POLL_S = 0.5
"""How often the subscriber looks at the server's state between messages."""
REPLAY_TIMEOUT_S = 2.0
IDLE_REPLAY_S = 5.0
"""After this long without a message the subscriber asks the replay socket for what follows the
last one it applied: a lost last message has no successor to reveal the gap (a PUB socket drops
what it sends before a subscription takes, or past its high-water mark)."""
MAX_WARNINGS = 5
"""Lost-event warnings logged per server lifetime (then counted only)."""


class ServerLife(Protocol):
    """What the subscriber watches of the server (``server.VllmServer``)."""

    @property
    def ready(self) -> asyncio.Event: ...

    @property
    def num_starts(self) -> int: ...


class KvEventSubscriber:
    def __init__(
        self,
        endpoints: KvEventsEndpoints,
        block_tokens: int,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
        new_epoch: Callable[[], int] = lambda: secrets.randbits(62),
    ) -> None:
        self.endpoints = endpoints
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks
        self.replay_timeout_s = replay_timeout_s
        self._new_epoch = new_epoch
        self.translator = self._translator()
        """The current server lifetime's (read it afresh each time: replaced per lifetime)."""
        self.num_lifetimes = 0
        self.num_messages = 0
        self.num_gaps = 0
        """Sequence gaps seen (each asked the replay socket)."""
        self.num_lost = 0
        """Times events were lost for good (gap not replayed, junk): the translator cleared."""
        self._expected = 0
        self._warnings = 0

    def _translator(self) -> BlockTranslator:
        return BlockTranslator(self.block_tokens, self._new_epoch(), self.max_blocks)

    def _new_lifetime(self) -> None:
        self.translator = self._translator()
        self._expected = 0
        self._warnings = 0

    def details(self) -> dict[str, object]:
        """For the node's ``/health``."""
        s = self.translator.stats()
        return {
            "endpoint": self.endpoints.endpoint,
            "lifetimes": self.num_lifetimes,
            "messages": self.num_messages,
            "gaps": self.num_gaps,
            "lost": self.num_lost,
            "blocks": s.num_blocks,
            "attached_blocks": s.num_attached,
            "entries": s.num_entries,
            "unacknowledged": len(self.translator.journal),
            "epoch": self.translator.journal.epoch,
            "disabled": s.disabled,
        }

    # -- the subscription -------------------------------------------------------------------------
    async def run(self, server: ServerLife) -> None:
        """Follow every lifetime of ``server`` until cancelled."""
        ctx = zmq.asyncio.Context()
        try:
            while True:
                await server.ready.wait()
                start = server.num_starts
                self._new_lifetime()
                self.num_lifetimes += 1

                def alive(start: int = start) -> bool:
                    return server.ready.is_set() and server.num_starts == start

                await self._follow(ctx, alive)
                self._new_lifetime()  # the server is gone, and its cache with it
                log.info("KV events: server lifetime %d over", self.num_lifetimes)
        finally:
            ctx.destroy(linger=0)

    async def _follow(self, ctx: zmq.asyncio.Context, alive: Callable[[], bool]) -> None:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.endpoints.endpoint)
        try:
            await self._replay(ctx, 0)  # what the server published before we subscribed
            idle_s = 0.0
            while alive():
                if await sub.poll(int(POLL_S * 1000)):
                    idle_s = 0.0
                    await self._on_message(ctx, await sub.recv_multipart())
                elif (idle_s := idle_s + POLL_S) >= IDLE_REPLAY_S:
                    idle_s = 0.0
                    await self._replay(ctx, self._expected)
        finally:
            sub.close(linger=0)

    async def _on_message(self, ctx: zmq.asyncio.Context, frames: list[bytes]) -> None:
        self.num_messages += 1
        if len(frames) != 3:
            self._lost(f"a message of {len(frames)} frames")
            return
        try:
            seq = parse_seq(frames[1])
        except EventDecodeError as exc:
            self._lost(str(exc))
            return
        if seq < self._expected:
            return  # a replay gave it already
        if seq > self._expected:
            self.num_gaps += 1
            await self._replay(ctx, self._expected)
            if seq < self._expected:
                return
            if seq > self._expected:
                self._lost(f"messages {self._expected}..{seq - 1} not replayed")
                self._expected = seq
        self._apply(seq, frames[2])

    def _apply(self, seq: int, payload: bytes) -> None:
        self._expected = seq + 1
        try:
            events = decode_batch(payload)
        except EventDecodeError as exc:
            self._lost(f"message {seq}: {exc}")
            return
        self.translator.apply(events)

    async def _replay(self, ctx: zmq.asyncio.Context, start: int) -> None:
        """Apply what the replay socket still has from ``start`` on (nothing if it does not
        answer within ``replay_timeout_s``)."""
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoints.replay_endpoint)
        try:
            await sock.send_multipart([b"", start.to_bytes(SEQ_BYTES, "big")])
            async with asyncio.timeout(self.replay_timeout_s):
                while True:
                    frames = await sock.recv_multipart()
                    if len(frames) != 4:
                        self._lost(f"a replay message of {len(frames)} frames")
                        return
                    if frames[2] == END_SEQ:
                        return
                    seq = parse_seq(frames[2])
                    if seq < self._expected:
                        continue
                    if seq > self._expected:
                        self._lost(f"messages {self._expected}..{seq - 1} no longer replayable")
                    self._apply(seq, frames[3])
        except TimeoutError:
            log.debug("KV events: no replay from %s", self.endpoints.replay_endpoint)
        except EventDecodeError as exc:
            self._lost(f"replay: {exc}")
        finally:
            with contextlib.suppress(zmq.ZMQError):
                sock.close(linger=0)

    def _lost(self, why: str) -> None:
        self.num_lost += 1
        self.translator.clear()
        if self._warnings < MAX_WARNINGS:
            self._warnings += 1
            log.warning("KV events lost (%s): the prefix report starts again from empty", why)
