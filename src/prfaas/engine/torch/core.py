"""``EngineLoop``: the one thread that runs every forward pass of a ``TorchEngine``.

Like vLLM's EngineCore busy loop: callers (the event loop, or a blocking caller) put tasks in an
inbox and wait on ``concurrent.futures.Future`` s; the thread takes them out and runs them one
slice (one forward pass) at a time. A round runs the oldest waiting decode step, then one chunk of
the oldest prefill, so a long prefill cut into chunks never stalls the running streams for more
than one chunk, and no two passes ever run at once.

Failures: an ``Exception`` out of a slice fails that task alone (its future carries it). An
``EngineFault`` (a task saying the engine itself is broken) or anything that is not an
``Exception`` stops the thread: ``fault`` then says why, every pending task fails with
``EngineDead(fault)``, and so does every later ``submit``. ``close()`` stops it on purpose.

The thread holds no reference to the engine (only to tasks while they are pending), so an engine
nobody holds is collected and its ``weakref.finalize`` stops the thread. No asyncio here.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from prfaas.engine.errors import EngineDead, EngineError

log = logging.getLogger(__name__)


class EngineFault(EngineError):
    """Raised by a task when the failure is the engine's, not its request's: the loop stops."""


class Task:
    """Work for the loop. ``run_slice`` runs one forward pass and returns True when the task is
    finished (its future resolved). ``cancel()`` may be called from any thread: the loop drops a
    cancelled task before its next slice."""

    is_step = False

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        """Its caller asked to cancel, or stopped waiting (the future was cancelled)."""
        return self._cancelled.is_set() or self.future.cancelled()

    def cancel(self) -> None:
        self._cancelled.set()

    def run_slice(self) -> bool:
        raise NotImplementedError

    def dropped(self) -> None:
        """Called on the loop thread when a cancelled task is dropped: free what it holds."""

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


_STOP = object()


class EngineLoop:
    def __init__(self, name: str) -> None:
        self.name = name
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._fault = ""
        self._stopped = False
        self._steps: deque[Task] = deque()
        self._prefills: deque[Task] = deque()
        # Written by the loop thread only; a float read elsewhere is whole under the GIL.
        self._slice_cpu_s = 0.0

    @property
    def slice_cpu_s(self) -> float:
        """CPU seconds this thread has spent in its slices (decode steps, prefill chunks) so far
        (``time.thread_time``: its own CPU only, so torch's intra-op threads, where there are
        more than one, are not in it; on a GPU, the launching only). Beside the process's whole
        CPU it splits the engine's passes (what a profile's curves price) from the rest."""
        return self._slice_cpu_s

    @property
    def fault(self) -> str:
        """Why the loop stopped ("" while it runs or before it starts)."""
        return self._fault

    @property
    def stopped(self) -> bool:
        return self._stopped

    def on_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, task: Task) -> None:
        """Queue ``task`` (starting the thread on first use), or raise ``EngineDead``."""
        with self._lock:
            if self._stopped:
                raise EngineDead(self._fault or "engine closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._inbox.put(task)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the thread and join it; tasks still pending fail with ``EngineDead``."""
        self.stop_soon()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def stop_soon(self) -> None:
        """Ask the thread to stop (safe from any thread, a finalizer included; no join)."""
        with self._lock:
            if self._stopped:
                return
            if self._thread is None:
                self._stopped = True
                self._fault = self._fault or "engine closed"
                return
        self._inbox.put(_STOP)

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        reason = "engine closed"
        try:
            while self._take_inbox(block=not (self._steps or self._prefills)):
                self._round()
        except BaseException as exc:  # the loop must not die silently: say why, fail the rest
            reason = f"engine thread died: {type(exc).__name__}: {exc}"
            log.error("%s: %s", self.name, reason, exc_info=True)
        self._die(reason)

    def _take_inbox(self, block: bool) -> bool:
        """Move new tasks into the step/prefill queues; False once asked to stop."""
        while True:
            try:
                item = self._inbox.get(block=block)
            except queue.Empty:
                return True
            if item is _STOP:
                return False
            (self._steps if item.is_step else self._prefills).append(item)
            block = False

    def _round(self) -> None:
        """One decode step (if one is waiting), then one chunk of the oldest prefill."""
        for tasks in (self._steps, self._prefills):
            while tasks and tasks[0].cancelled:
                tasks.popleft().dropped()
            if tasks:
                self._slice(tasks)

    def _slice(self, tasks: deque[Task]) -> None:
        task = tasks[0]
        started = time.thread_time()
        try:
            finished = task.run_slice()
        except EngineFault:
            raise
        except Exception as exc:  # the request's own failure: it alone fails
            tasks.popleft()
            task.fail(exc)
            return
        finally:
            self._slice_cpu_s += time.thread_time() - started
        if finished:
            tasks.popleft()

    def _die(self, reason: str) -> None:
        with self._lock:
            self._stopped = True
            if reason != "engine closed" or not self._fault:
                self._fault = reason
        dead = EngineDead(self._fault)
        pending = [*self._steps, *self._prefills]
        self._steps.clear()
        self._prefills.clear()
        while True:  # nothing enters once stopped is set: this empties the inbox for good
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                pending.append(item)
        for task in pending:
            task.fail(dead)
