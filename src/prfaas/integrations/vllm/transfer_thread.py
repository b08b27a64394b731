"""``TransferThread``: one vLLM worker process's prfaas.transfer engine, off the forward path.

One daemon thread runs an asyncio loop holding
- the sender links, a ``transfer.link_pool.LinkPool`` (as WorkerHost's): one ``Link`` per
  receiver and route (a receiver reached across sites and within its site gets two, paced and
  not), reused by every session to it and replaced when it broke, connected within
  ``CONNECT_TIMEOUT_S``; the cross-site ones share one pacer, are monitored and feed one capacity
  estimate of the destination link (``settings.link``), sampled on the pool's own timer;
- the ``Receiver`` (when the settings give a listen port), whose sessions are staged for the
  worker within ``kv_budget_mib`` and awaited to their digest check
  (``staged_sessions.StagedSessions``, ``staged``: the worker ``claim``s, ``poll``s and
  ``release``s them there), so the worker only ever sees verified bytes;
- the agent socket (``agent_server.AgentServer``: a unix stream socket, mode 0600) the sidecar
  asks ``wait_sent`` / ``abort`` / ``stats`` on (one JSON object per line each way).
The worker's thread calls the methods below; they hand work to the loop with
``call_soon_threadsafe`` (``staged`` shares its state under its own lock), so a forward pass
never waits on the network. Imports neither torch nor vllm: the tensors it is handed arrive as
memoryviews plus an opaque object to keep alive until the session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from prfaas.integrations.vllm.agent_server import AgentOps, AgentServer
from prfaas.integrations.vllm.settings import ConnectorSettings
from prfaas.integrations.vllm.staged_sessions import StagedSessions
from prfaas.integrations.vllm.trace import TRACE
from prfaas.transfer import (
    ConnectError,
    Manifest,
    Receiver,
    SessionAborted,
    TransferConfig,
)
from prfaas.transfer.link_pool import DEPLOYMENT_KEY, Destination, LinkPool

log = logging.getLogger("prfaas.integrations.vllm")

_KEEP_DONE = 4096  # finished send jobs remembered for wait_sent after the fact
_SEND_IDLE_TIMEOUT_S = 60.0  # a session whose producer went silent this long is aborted


@dataclass(slots=True)
class _SendJob:
    transfer_id: str
    host: str
    port: int
    cross_site: bool
    manifest: Manifest | None
    """None: a send the connector failed before it was opened."""
    queue: asyncio.Queue[tuple[int, int, memoryview] | None] = field(default_factory=asyncio.Queue)
    keep: list[object] = field(default_factory=list)
    state: str = "sending"  # -> verified | failed
    error: str = ""
    kv_bytes: int = 0
    handed_bytes: int = 0
    """Bytes the connector handed over (queued here or given to the session)."""
    accepted_bytes: int = 0
    """Bytes the session (its link's sender) accepted so far."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class TransferThread:
    """The transfer engine of one worker process, in its own thread and event loop."""

    def __init__(self, settings: ConnectorSettings, psk: bytes, name: str = "vllm") -> None:
        self.settings = settings
        self._psk = psk
        self._name = name.encode()[-60:].decode(errors="ignore")  # HELLO names are <= 64 bytes
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="prfaas-kv", daemon=True)
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        # loop-owned
        self._pool = LinkPool(
            self._name, {DEPLOYMENT_KEY: psk}, num_connections=settings.num_connections
        )
        # The one destination link its cross-site sends cross: paced at the settings' pace,
        # estimated from the link's rate (``set_pace`` re-rates both).
        self._pool.set_route(settings.link, settings.pace_bytes_per_s, settings.link_bytes_per_s)
        self._cross_site_bytes = 0
        """Bytes cross-site sends' links accepted so far, piece by piece."""
        self._sends: OrderedDict[str, _SendJob] = OrderedDict()
        self.staged = StagedSessions(settings.kv_budget_bytes, self._spawn, self._call)
        """What the receiver took in, staged for the worker (``claim``/``poll``/``release``)."""
        self._receiver: Receiver | None = None
        self._agent: AgentServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.listen_address: tuple[str, int] | None = None
        self.sessions_sent = 0

    # -- lifecycle (worker thread) -------------------------------------------------------------
    def start(self) -> None:
        """Start the thread; returns once the receiver listens and the agent socket is bound."""
        self._thread.start()
        self._ready.wait(60)
        if self._start_error is not None:
            raise self._start_error
        if not self._ready.is_set():
            raise RuntimeError("the prfaas transfer thread did not start within 60 s")

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(Exception):
            fut.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        if TRACE.on:
            TRACE("transfer_thread", affinity=sorted(os.sched_getaffinity(0)))
        try:
            self._loop.run_until_complete(self._startup())
        except BaseException as exc:  # reported to start(), which raises it in the worker
            self._start_error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _startup(self) -> None:
        s = self.settings
        if s.listen_port is not None:
            assert s.listen_host is not None
            cfg = TransferConfig(psk=self._psk, name=self._name)
            self._receiver = Receiver(cfg, self.staged.allocate)
            await self._receiver.__aenter__()
            self.listen_address = await self._receiver.listen(s.listen_host, s.listen_port)
            self._spawn(self.staged.accept(self._receiver))
        if s.agent_socket is not None:
            ops = AgentOps(
                self._wait_sent,
                self._abort_by_sidecar,
                self.stats,
                self.set_pace,
                self.staged.load_result,
            )
            self._agent = AgentServer(s.agent_socket, ops)
            await self._agent.start()
        self._spawn(self.staged.reap())
        self._spawn(self._pool.run())

    async def _shutdown(self) -> None:
        for job in list(self._sends.values()):
            if job.task is not None:
                job.task.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self._agent is not None:
            await self._agent.aclose()
        await self._pool.aclose()
        if self._receiver is not None:
            await self._receiver.aclose()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _call(self, fn: Callable[..., object], *args: object) -> None:
        self._loop.call_soon_threadsafe(fn, *args)

    # -- sending (worker thread) ---------------------------------------------------------------
    def open_send(
        self, transfer_id: str, host: str, port: int, cross_site: bool, manifest: Manifest
    ) -> None:
        """Start session ``transfer_id`` to ``host:port``; bytes may be handed over at once."""
        self._call(self._open_send, transfer_id, host, port, cross_site, manifest)

    def send(
        self, transfer_id: str, layer: int, offset: int, data: memoryview, keep: object
    ) -> None:
        """Queue bytes of manifest layer ``layer`` at ``offset``; ``keep`` (the tensor behind
        ``data``) is held until the session ends."""
        self._call(self._queue_send, transfer_id, (layer, offset, data), keep)

    def finish_send(self, transfer_id: str) -> None:
        """Every byte was handed over: send END and wait (in the loop) for verification."""
        self._call(self._queue_send, transfer_id, None, None)

    def abort(self, transfer_id: str, reason: str) -> None:
        self._call(self._abort, transfer_id, reason)

    def fail_send(self, transfer_id: str, reason: str) -> None:
        """The connector gave up on this send: abort its session, or (never opened) record it
        failed, so ``wait_sent`` answers "failed" with ``reason`` at once, not "unknown" later."""
        self._call(self._fail_send, transfer_id, reason)

    # -- loop side: sending --------------------------------------------------------------------
    def _open_send(
        self, tid: str, host: str, port: int, cross_site: bool, manifest: Manifest
    ) -> None:
        old = self._sends.pop(tid, None)
        if old is not None and old.task is not None and not old.done.is_set():
            old.task.cancel()
        job = _SendJob(tid, host, port, cross_site, manifest)
        self._sends[tid] = job
        while len(self._sends) > _KEEP_DONE:
            _, oldest = self._sends.popitem(last=False)
            if oldest.task is not None and not oldest.done.is_set():
                oldest.task.cancel()
        job.task = self._spawn(self._run_send(job))

    def _queue_send(self, tid: str, item: tuple[int, int, memoryview] | None, keep: object) -> None:
        job = self._sends.get(tid)
        if job is None or job.done.is_set():
            return  # aborted meanwhile: the bytes are dropped
        if keep is not None:
            job.keep.append(keep)
        if item is not None:
            job.handed_bytes += len(item[2])
        job.queue.put_nowait(item)

    def _abort(self, tid: str, reason: str) -> bool:
        found = False
        job = self._sends.get(tid)
        if job is not None and not job.done.is_set() and job.task is not None:
            job.error = reason
            job.task.cancel()
            found = True
        return self.staged.drop(tid, reason) or found

    def _fail_send(self, tid: str, reason: str) -> None:
        job = self._sends.get(tid)
        if job is None:
            job = _SendJob(tid, "", 0, False, None, state="failed", error=reason)
            job.done.set()
            self._sends[tid] = job
        elif not job.done.is_set():
            # Settled here, not when the task unwinds: a cancel can land where the session
            # library absorbs it, and wait_sent must answer now, not after the idle timeout.
            job.state, job.error = "failed", reason
            job.done.set()
            if job.task is not None:
                job.task.cancel()

    async def _run_send(self, job: _SendJob) -> None:
        try:
            assert job.manifest is not None  # opened sends carry one
            session = None
            route = self.settings.link if job.cross_site else None
            dest = Destination(job.host, job.port, route, DEPLOYMENT_KEY)
            for attempt in (0, 1):  # a link that broke since its last use is replaced once
                link = await self._pool.link_to(dest)
                try:
                    session = await link.open(job.manifest)
                    break
                except ConnectError:
                    await self._pool.drop(dest, link)
                    if attempt:
                        raise
            assert session is not None
            TRACE("send_opened", job.transfer_id, queued_bytes=job.handed_bytes)
            async with session:
                while True:
                    async with asyncio.timeout(_SEND_IDLE_TIMEOUT_S):
                        item = await job.queue.get()
                    if item is None:
                        TRACE("send_end", job.transfer_id, sent_bytes=session.bytes_sent)
                        await session.finish(-1)
                        break
                    await session.send(*item)
                    job.accepted_bytes += len(item[2])
                    if job.cross_site:
                        self._cross_site_bytes += len(item[2])
            if not job.done.is_set():  # (a send failed meanwhile stays failed)
                job.state, job.kv_bytes = "verified", job.manifest.num_bytes
                self.sessions_sent += 1
                TRACE("send_verified", job.transfer_id, kv_bytes=job.kv_bytes)
        except asyncio.CancelledError:
            if not job.done.is_set():
                job.state, job.error = "failed", job.error or "aborted"
        except (SessionAborted, ConnectError, TimeoutError, ValueError, OSError) as exc:
            if not job.done.is_set():
                job.state, job.error = "failed", f"{type(exc).__name__}: {exc}"
                log.warning("KV send of %s failed: %s", job.transfer_id, job.error)
        except Exception as exc:  # a bug: this send fails (and says so), the thread goes on
            if not job.done.is_set():
                job.state, job.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("KV send of %s failed", job.transfer_id)
        finally:
            job.keep.clear()
            job.done.set()

    def set_pace(self, gbps: float) -> dict[str, Any]:
        """Pace every cross-site link at ``gbps`` from the next chunk on (the agent's
        ``set_pace``; loop thread), and estimate the link afresh from that rate
        (``LinkPool.set_route``: a re-shaped link is another link)."""
        rate = gbps * 1e9 / 8
        self._pool.set_route(self.settings.link, rate, rate)
        TRACE("set_pace", gbps=gbps)
        return {"pace_gbps": gbps}

    # -- agent ops (loop; agent_server.AgentServer serves the socket) -------------------------
    def _abort_by_sidecar(self, tid: str) -> bool:
        return self._abort(tid, "aborted by the sidecar")

    async def _wait_sent(self, tid: str, timeout_s: float) -> dict[str, Any]:
        deadline = self._loop.time() + timeout_s
        job = self._sends.get(tid)
        while job is None and self._loop.time() < deadline:  # the prefill may not be scheduled yet
            await asyncio.sleep(0.01)
            job = self._sends.get(tid)
        if job is None:
            return {"state": "unknown", "kv_bytes": 0, "error": "no such transfer"}
        try:
            async with asyncio.timeout(max(0.0, deadline - self._loop.time())):
                await job.done.wait()
        except TimeoutError:
            return {"state": "timeout", "kv_bytes": 0, "error": f"not verified in {timeout_s:g} s"}
        return {"state": job.state, "kv_bytes": job.kv_bytes, "error": job.error}

    def stats(self) -> dict[str, Any]:
        """The contract's stats (loop thread): the pool's reading of each destination link
        (``core.SenderLinkReport``, as JSON), the bytes cross-site sends' links accepted so far
        (``cross_site_bytes``), what the open cross-site sends have not handed to their links yet
        (``cross_site_unsent_bytes``: a session counts whole from its opening, as WorkerHost's
        nodes count theirs), every link's bytes acknowledged (``egress_bytes``, dropped links
        included) and not yet (``egress_backlog_bytes``), and the receiving side's counters."""
        unsent = sum(
            j.manifest.num_bytes - j.accepted_bytes
            for j in self._sends.values()
            if j.cross_site and j.manifest is not None and not j.done.is_set()
        )
        rx = self._receiver
        return {
            "links": [r.to_json() for r in self._pool.reports()],
            "cross_site_bytes": self._cross_site_bytes,
            "cross_site_unsent_bytes": max(0, unsent),
            "egress_bytes": self._pool.acked_bytes(),
            "egress_backlog_bytes": self._pool.backlog_bytes(),
            "handshake_failures": 0 if rx is None else rx.num_handshake_failures,
            "sessions_sent": self.sessions_sent,
            **self.staged.counts(),
        }
