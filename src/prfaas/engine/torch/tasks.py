"""The ``TorchEngine``'s work for its ``EngineLoop``: a decode step (``StepTask``, one slice) and
a prefill (``PrefillTask``, one slice per chunk of its ``PrefillJob``).

Owns how a task resolves its future and what a dropped or failed prefill gives back (its request
id, through ``forget``); what the work does is the engine's (callables passed in). Imports only the
loop's ``Task`` and the prefill job: never the engine, no asyncio.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable
from typing import Any

from prfaas.engine.api import PrefillResult, TokenEvent
from prfaas.engine.errors import EngineError
from prfaas.engine.torch.core import Task
from prfaas.engine.torch.prefill import PrefillJob


def resolve(future: concurrent.futures.Future[Any], value: object) -> None:
    # InvalidStateError: the waiter cancelled, nobody wants the value.
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_result(value)


class StepTask(Task):
    is_step = True

    def __init__(self, step: Callable[[], tuple[TokenEvent, ...]]) -> None:
        super().__init__()
        self._step = step

    def run_slice(self) -> bool:
        resolve(self.future, self._step())
        return True


class PrefillTask(Task):
    def __init__(
        self,
        make: Callable[[], PrefillJob],
        finish: Callable[[PrefillTask, PrefillJob], PrefillResult],
        forget: Callable[[str], None],
        request_id: str,
        split: Callable[[], bool],
    ) -> None:
        super().__init__()
        self._make, self._finish, self._forget = make, finish, forget
        self.request_id = request_id
        self._split = split
        self._job: PrefillJob | None = None

    def run_slice(self) -> bool:
        if self._job is None:
            self._job = self._make()
        self._job.run_chunk(split=self._split())
        if not self._job.done:
            return False
        resolve(self.future, self._finish(self, self._job))
        return True

    def dropped(self) -> None:
        self._job = None  # frees its cache now
        self._forget(self.request_id)
        self.fail(EngineError(f"request {self.request_id}: prefill cancelled"))

    def fail(self, exc: BaseException) -> None:
        self._job = None
        self._forget(self.request_id)
        super().fail(exc)
