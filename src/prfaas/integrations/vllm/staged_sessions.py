"""``StagedSessions``: the KV sessions a vLLM Worker's receiver takes in, staged for its worker
side until claimed, installed or dropped (``transfer_thread.TransferThread`` owns one).

``allocate`` (the ``Receiver``'s) stages each incoming session in fresh buffers within the KV
budget; ``accept`` awaits each to its digest check, so the worker only ever sees verified bytes;
the worker thread ``claim``s a session, ``poll``s its outcome and ``release``s it (counted as a
load installed or recomputed); ``reap`` frees sessions nobody claimed within
``UNCLAIMED_STAGED_TTL_S``. The worker thread and the loop thread share the state under one lock.
Imports neither torch nor vllm.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from prfaas.integrations.vllm.settings import UNCLAIMED_STAGED_TTL_S
from prfaas.transfer import Delivery, InboundSession, Manifest, Receiver, Refused, SessionAborted

log = logging.getLogger("prfaas.integrations.vllm")


KEEP_LOAD_RESULTS = 4096
"""Load outcomes remembered for the sidecar's ``load_result`` after the fact."""


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    """What became of a claimed session: verified bytes (``delivery``) or why not."""

    transfer_id: str
    delivery: Delivery | None
    error: str = ""


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


class StagedSessions:
    """Received sessions staged for the worker (shared by the worker and the loop thread)."""

    def __init__(
        self,
        budget_bytes: int,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        call_soon: Callable[..., object],
    ) -> None:
        self._budget_bytes = budget_bytes
        self._spawn = spawn  # a task in the loop
        self._call_soon = call_soon  # a call in the loop, from the worker thread
        self._lock = threading.Lock()
        self._staged: dict[str, _Staged] = {}  # under the lock
        self._claims: dict[str, _Claim] = {}  # under the lock
        self._staged_bytes = 0  # under the lock
        self.sessions_received = 0
        self.loads_ok = 0  # counted by the connector, under the lock
        self.loads_failed = 0
        self._load_results: OrderedDict[str, bool] = OrderedDict()
        """Per transfer id, the newest ``KEEP_LOAD_RESULTS`` loads: installed (True) or
        recomputed (False); the sidecar asks per request after its decode (``load_result``)."""

    def counts(self) -> dict[str, int]:
        """The agent's receiving-side stats."""
        with self._lock:
            return {
                "staged_bytes": self._staged_bytes,
                "sessions_received": self.sessions_received,
                "loads_ok": self.loads_ok,
                "loads_failed": self.loads_failed,
            }

    # -- the worker thread ---------------------------------------------------------------------
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
        self._call_soon(self.drop, transfer_id, "released by the worker")

    def count_failed_load(self, transfer_id: str | None = None) -> None:
        """A load that failed before it claimed a session (counted in ``loads_failed``; the
        request's ``load_result`` says recomputed)."""
        with self._lock:
            self.loads_failed += 1
            if transfer_id is not None:
                self._remember_load(transfer_id, False)

    def _remember_load(self, transfer_id: str, ok: bool) -> None:
        """Under the lock."""
        self._load_results[transfer_id] = ok
        self._load_results.move_to_end(transfer_id)
        while len(self._load_results) > KEEP_LOAD_RESULTS:
            self._load_results.popitem(last=False)

    def load_result(self, transfer_id: str) -> dict[str, Any]:
        """The agent's ``load_result``: ``{"state": "installed" | "recomputed" | "unknown"}``
        (unknown: no load of that id counted, or forgotten)."""
        with self._lock:
            ok = self._load_results.get(transfer_id)
        return {"state": "unknown" if ok is None else "installed" if ok else "recomputed"}

    # -- the loop thread -----------------------------------------------------------------------
    def allocate(self, manifest: Manifest) -> list[bytearray]:
        """The receiver's ``allocate``: fresh buffers within the budget, or ``Refused``."""
        tid, need = manifest.request_id, manifest.num_bytes
        self.drop(tid, "replaced by a newer session with the same transfer id")
        with self._lock:
            if self._staged_bytes + need > self._budget_bytes:
                raise Refused(
                    f"over KV budget: {need} bytes asked, {self._staged_bytes} of "
                    f"{self._budget_bytes} staged"
                )
            self._staged_bytes += need
            staged = _Staged(tid, manifest, need, time.monotonic())
            staged.claimed = tid in self._claims
            self._staged[tid] = staged
        return [bytearray(layer.num_bytes) for layer in manifest.layers]

    async def accept(self, rx: Receiver) -> None:
        """Take every session ``rx`` accepts and await each to its digest check."""
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
            self._fail(staged, f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # a bug: this load fails (the decode side recomputes)
            log.exception("KV session %s failed", staged.transfer_id)
            self._fail(staged, f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            if not staged.freed:
                staged.delivery = delivery
                self.sessions_received += 1

    def _fail(self, staged: _Staged, error: str) -> None:
        log.warning("KV session %s failed: %s", staged.transfer_id, error)
        with self._lock:
            staged.error = staged.error or error
            if not staged.freed:  # the receiver no longer writes an aborted session's buffers
                staged.freed = True
                self._staged_bytes -= staged.num_bytes

    def drop(self, tid: str, reason: str) -> bool:
        """Forget session ``tid`` (aborting it if it is still arriving); False: none staged."""
        with self._lock:
            staged = self._staged.pop(tid, None)
            if staged is None:
                return False
            was_freed, staged.freed = staged.freed, True
            if not was_freed:
                self._staged_bytes -= staged.num_bytes
        s = staged.session
        if s is not None and s.error is None and staged.delivery is None:
            s.abort(reason)
        return True

    async def reap(self) -> None:
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
                self.drop(tid, f"not claimed within {UNCLAIMED_STAGED_TTL_S:g} s")
