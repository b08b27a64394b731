"""``TransferThread``: one vLLM worker process's prfaas.transfer engine, off the forward path.

One daemon thread runs an asyncio loop holding
- the sender links, one ``Link`` per receiver ``(host, port)``, reused by every session to it and
  replaced when it broke (each with a ``LinkMonitor`` sampling its counters and ``TCP_INFO``);
- the ``Receiver`` (when the settings give a listen port), whose ``allocate`` stages each incoming
  session in fresh buffers within ``kv_budget_mib``, and whose sessions are awaited to their
  digest check here, so the worker only ever sees verified bytes;
- the cross-site links' one pacer and capacity estimate (``cross_site_links.CrossSiteLinks``);
- the agent socket (``agent_server.AgentServer``: a unix stream socket, mode 0600) the sidecar
  asks ``wait_sent`` / ``abort`` / ``stats`` on (one JSON object per line each way).
The worker's thread calls the methods below; they hand work to the loop with
``call_soon_threadsafe`` and read shared state under one lock, so a forward pass never waits on
the network. Imports neither torch nor vllm: the tensors it is handed arrive as memoryviews plus
an opaque object to keep alive until the session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from prfaas.core import LinkId, LinkState
from prfaas.integrations.vllm.agent_server import AgentOps, AgentServer
from prfaas.integrations.vllm.cross_site_links import CrossSiteLinks
from prfaas.integrations.vllm.settings import UNCLAIMED_STAGED_TTL_S, ConnectorSettings
from prfaas.integrations.vllm.trace import TRACE
from prfaas.transfer import (
    ConnectError,
    Delivery,
    InboundSession,
    Link,
    LinkMonitor,
    Manifest,
    Receiver,
    Refused,
    SessionAborted,
    TransferConfig,
)

log = logging.getLogger("prfaas.integrations.vllm")

_KEEP_DONE = 4096  # finished send jobs remembered for wait_sent after the fact
_SEND_IDLE_TIMEOUT_S = 60.0  # a session whose producer went silent this long is aborted
_MONITOR_INTERVAL_S = 0.5


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    """What became of a claimed session: verified bytes (``delivery``) or why not."""

    transfer_id: str
    delivery: Delivery | None
    error: str = ""


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


@dataclass(slots=True)
class _Staged:
    transfer_id: str
    manifest: Manifest
    num_bytes: int
    arrived_at_s: float
    session: InboundSession | None = None
    delivery: Delivery | None = None
    error: str = ""
    claimed: bool = False
    freed: bool = False


@dataclass(slots=True)
class _Claim:
    deadline_s: float


@dataclass(slots=True)
class _LinkEntry:
    link: Link
    monitor: LinkMonitor
    monitor_task: asyncio.Task[None] | None = None
    latest: LinkState | None = None
    cross_site: bool = False
    """How its last session reached the receiver (it is paced, and estimated, only then)."""


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
        self._lock = threading.Lock()
        # loop-owned (read under the lock by the worker thread where noted)
        self._links: dict[tuple[str, int], _LinkEntry] = {}
        self._link_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._sends: OrderedDict[str, _SendJob] = OrderedDict()
        self._staged: dict[str, _Staged] = {}  # under the lock
        self._claims: dict[str, _Claim] = {}  # under the lock
        self._staged_bytes = 0  # under the lock
        self._receiver: Receiver | None = None
        self._agent: AgentServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._egress_closed_bytes = 0
        self._cross = CrossSiteLinks(settings, self._cross_site_links, self._loop.time)
        self.listen_address: tuple[str, int] | None = None
        self.sessions_sent = 0
        self.sessions_received = 0
        self.loads_ok = 0  # counted by the connector, under the lock
        self.loads_failed = 0
        self._load_results: OrderedDict[str, bool] = OrderedDict()
        """Per transfer id, the newest ``_KEEP_DONE`` loads: installed (True) or recomputed."""

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
            self._receiver = Receiver(cfg, self._allocate)
            await self._receiver.__aenter__()
            self.listen_address = await self._receiver.listen(s.listen_host, s.listen_port)
            self._spawn(self._accept_sessions(self._receiver))
        if s.agent_socket is not None:
            ops = AgentOps(
                self._wait_sent, self._abort_by_sidecar, self.stats, self.set_pace, self.load_result
            )
            self._agent = AgentServer(s.agent_socket, ops)
            await self._agent.start()
        self._spawn(self._reap())
        self._spawn(self._cross.sample())

    async def _shutdown(self) -> None:
        for job in list(self._sends.values()):
            if job.task is not None:
                job.task.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self._agent is not None:
            await self._agent.aclose()
        for entry in list(self._links.values()):
            if entry.monitor_task is not None:
                entry.monitor_task.cancel()
            await entry.link.aclose()
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

    # -- loading (worker thread) ---------------------------------------------------------------
    def claim(self, transfer_id: str, timeout_s: float) -> None:
        """The worker wants session ``transfer_id``, verified within ``timeout_s``."""
        with self._lock:
            self._claims[transfer_id] = _Claim(time.monotonic() + timeout_s)
            staged = self._staged.get(transfer_id)
            if staged is not None:
                staged.claimed = True

    def poll(self, transfer_id: str) -> LoadOutcome | None:
        """The claimed session's outcome once known, else None (still arriving)."""
        with self._lock:
            claim = self._claims.get(transfer_id)
            staged = self._staged.get(transfer_id)
            if staged is not None and staged.delivery is not None:
                return LoadOutcome(transfer_id, staged.delivery)
            if staged is not None and staged.error:
                return LoadOutcome(transfer_id, None, staged.error)
            if claim is not None and time.monotonic() > claim.deadline_s:
                got = "arriving" if staged is not None else "none arrived"
                return LoadOutcome(transfer_id, None, f"no verified session in time ({got})")
            return None

    def release(self, transfer_id: str, *, ok: bool | None = None) -> None:
        """The worker is done with ``transfer_id`` (installed, failed or abandoned): free it.
        ``ok`` counts the load (True: installed, False: recomputed, None: not counted)."""
        with self._lock:
            self._claims.pop(transfer_id, None)
            if ok is True:
                self.loads_ok += 1
            elif ok is False:
                self.loads_failed += 1
            if ok is not None:
                self._remember_load(transfer_id, ok)
        self._call(self._drop_staged, transfer_id, "released by the worker")

    def count_failed_load(self, transfer_id: str | None = None) -> None:
        """A load that failed before it claimed a session (counted in ``loads_failed``; the
        request's ``load_result`` says recomputed)."""
        with self._lock:
            self.loads_failed += 1
            if transfer_id is not None:
                self._remember_load(transfer_id, False)

    def _remember_load(self, transfer_id: str, ok: bool) -> None:
        """Under the lock: the sidecar asks per request after its decode (``load_result``)."""
        self._load_results[transfer_id] = ok
        self._load_results.move_to_end(transfer_id)
        while len(self._load_results) > _KEEP_DONE:
            self._load_results.popitem(last=False)

    def load_result(self, transfer_id: str) -> dict[str, Any]:
        """The agent's ``load_result``: ``{"state": "installed" | "recomputed" | "unknown"}``
        (unknown: no load of that id counted, or forgotten)."""
        with self._lock:
            ok = self._load_results.get(transfer_id)
        return {"state": "unknown" if ok is None else "installed" if ok else "recomputed"}

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
        with self._lock:
            staged = self._staged.get(tid)
        if staged is not None:
            self._drop_staged(tid, reason)
            found = True
        return found

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
            for attempt in (0, 1):  # a link that broke since its last use is replaced once
                link = await self._link(job.host, job.port, job.cross_site)
                try:
                    session = await link.open(job.manifest)
                    break
                except ConnectError:
                    await self._drop_link((job.host, job.port), link)
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
                        self._cross.count_sent(len(item[2]))
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

    async def _link(self, host: str, port: int, cross_site: bool) -> Link:
        key = (host, port)
        lock = self._link_locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self._links.get(key)
            if entry is None:
                cfg = TransferConfig(
                    psk=self._psk,
                    num_connections=self.settings.num_connections,
                    name=self._name,
                )
                link = await Link.connect(host, port, cfg)
                monitor = LinkMonitor(link, LinkId(f"{self._name}->{host}:{port}"))
                entry = _LinkEntry(link, monitor)
                entry.monitor_task = self._spawn(monitor.run(self._publisher(entry)))
                self._links[key] = entry
            # The same receiver may be reached cross-site or not: the latest use decides.
            entry.cross_site = cross_site
            entry.link.share_pacer(self._cross.pacer() if cross_site else None)
            return entry.link

    def set_pace(self, gbps: float) -> dict[str, Any]:
        """Pace every cross-site link at ``gbps`` from the next chunk on (the agent's
        ``set_pace``; loop thread), and estimate the link afresh from that rate
        (``CrossSiteLinks.set_pace``)."""
        return self._cross.set_pace(gbps)

    def _cross_site_links(self) -> list[Link]:
        return [e.link for e in self._links.values() if e.cross_site]

    @staticmethod
    def _publisher(entry: _LinkEntry) -> Callable[[LinkState], None]:
        def publish(state: LinkState) -> None:
            entry.latest = state

        return publish

    async def _drop_link(self, key: tuple[str, int], link: Link) -> None:
        entry = self._links.get(key)
        if entry is not None and entry.link is link:
            del self._links[key]
            if entry.monitor_task is not None:
                entry.monitor_task.cancel()
            self._egress_closed_bytes += link.counters().bytes_acked
        await link.aclose()

    # -- loop side: receiving ------------------------------------------------------------------
    def _allocate(self, manifest: Manifest) -> list[bytearray]:
        tid, need = manifest.request_id, manifest.num_bytes
        self._drop_staged(tid, "replaced by a newer session with the same transfer id")
        with self._lock:
            if self._staged_bytes + need > self.settings.kv_budget_bytes:
                raise Refused(
                    f"over KV budget: {need} bytes asked, {self._staged_bytes} of "
                    f"{self.settings.kv_budget_bytes} staged"
                )
            self._staged_bytes += need
            staged = _Staged(tid, manifest, need, time.monotonic())
            staged.claimed = tid in self._claims
            self._staged[tid] = staged
        return [bytearray(layer.num_bytes) for layer in manifest.layers]

    async def _accept_sessions(self, rx: Receiver) -> None:
        async for session in rx:
            with self._lock:
                staged = self._staged.get(session.request_id)
                if staged is not None and staged.session is None:
                    staged.session = session
            if staged is None:
                session.abort("dropped before it was accepted")
                continue
            self._spawn(self._await_verified(staged, session))

    async def _await_verified(self, staged: _Staged, session: InboundSession) -> None:
        try:
            delivery = await session.complete(timeout_s=24 * 3600.0)  # the stall watchdog bounds it
        except (SessionAborted, TimeoutError) as exc:
            self._fail_staged(staged, f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # a bug: this load fails (the decode side recomputes)
            log.exception("KV session %s failed", staged.transfer_id)
            self._fail_staged(staged, f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            if not staged.freed:
                staged.delivery = delivery
                self.sessions_received += 1

    def _fail_staged(self, staged: _Staged, error: str) -> None:
        log.warning("KV session %s failed: %s", staged.transfer_id, error)
        with self._lock:
            staged.error = staged.error or error
            if not staged.freed:  # the receiver no longer writes an aborted session's buffers
                staged.freed = True
                self._staged_bytes -= staged.num_bytes

    def _drop_staged(self, tid: str, reason: str) -> None:
        with self._lock:
            staged = self._staged.pop(tid, None)
            if staged is None:
                return
            was_freed, staged.freed = staged.freed, True
            if not was_freed:
                self._staged_bytes -= staged.num_bytes
        s = staged.session
        if s is not None and s.error is None and staged.delivery is None:
            s.abort(reason)

    async def _reap(self) -> None:
        """Free staged sessions nobody claimed within the TTL, and forget stale failures."""
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            with self._lock:
                stale = [
                    s.transfer_id
                    for s in self._staged.values()
                    if not s.claimed and now - s.arrived_at_s > UNCLAIMED_STAGED_TTL_S
                ]
            for tid in stale:
                self._drop_staged(tid, f"not claimed within {UNCLAIMED_STAGED_TTL_S:g} s")

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
        """The contract's stats, from the links' own counters and TCP_INFO (loop thread)."""
        egress = self._egress_closed_bytes
        backlog = 0
        rtts: list[float] = []
        retrans = 0.0
        for entry in self._links.values():
            c = entry.link.counters()
            egress += c.bytes_acked
            backlog += c.backlog_bytes
            if entry.latest is not None:
                if entry.latest.rtt_s > 0:
                    rtts.append(entry.latest.rtt_s)
                retrans = max(retrans, entry.latest.retransmit_rate)
        rx = self._receiver
        with self._lock:
            return {
                **self._link_stats(),
                "egress_bytes": egress,
                "egress_backlog_bytes": backlog,
                "link_rtt_s": sum(rtts) / len(rtts) if rtts else 0.0,
                "link_retransmit_rate": retrans,
                "handshake_failures": 0 if rx is None else rx.num_handshake_failures,
                "staged_bytes": self._staged_bytes,
                "sessions_sent": self.sessions_sent,
                "sessions_received": self.sessions_received,
                "loads_ok": self.loads_ok,
                "loads_failed": self.loads_failed,
            }

    def _link_stats(self) -> dict[str, Any]:
        """The cross-site link's figures (loop thread; ``CrossSiteLinks.stats``), with what the
        open cross-site sends have not handed to their links yet (a session counts whole from its
        opening, as WorkerHost's nodes count theirs)."""
        unsent = sum(
            j.manifest.num_bytes - j.accepted_bytes
            for j in self._sends.values()
            if j.cross_site and j.manifest is not None and not j.done.is_set()
        )
        return self._cross.stats(unsent)
