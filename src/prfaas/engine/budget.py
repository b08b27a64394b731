"""``KvBudget``: KV cache bytes accounted against a fixed budget (no paging).

Each request reserves, when admitted, the bytes its cache will weigh at the end of generation
(``CacheSpec.bytes_for(prompt + max_new_tokens)``), so a running batch can never overflow mid-way.
A reservation that would overflow is refused before anything is allocated. Pure.
"""

from __future__ import annotations

from prfaas.engine.api import Allocation
from prfaas.engine.errors import BudgetExceeded
from prfaas.spec import CacheLayout


class KvBudget:
    __slots__ = ("_budget_bytes", "_reserved")

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"kv budget must be > 0 bytes, got {budget_bytes}")
        self._budget_bytes = budget_bytes
        self._reserved: dict[str, int] = {}

    @property
    def budget_bytes(self) -> int:
        return self._budget_bytes

    @property
    def used_bytes(self) -> int:
        return sum(self._reserved.values())

    @property
    def free_bytes(self) -> int:
        return self._budget_bytes - self.used_bytes

    def holds(self, request_id: str) -> bool:
        return request_id in self._reserved

    def reserve(self, request_id: str, num_bytes: int) -> None:
        if request_id in self._reserved:
            raise BudgetExceeded(f"request {request_id} already holds a reservation")
        if num_bytes > self.free_bytes:
            raise BudgetExceeded(
                f"request {request_id} needs {num_bytes} KV bytes, only {self.free_bytes} of "
                f"{self._budget_bytes} free ({len(self._reserved)} requests hold the rest)"
            )
        self._reserved[request_id] = num_bytes

    def release(self, request_id: str) -> None:
        self._reserved.pop(request_id, None)

    def allocate(self, request_id: str, layout: CacheLayout, num_bytes: int) -> Allocation:
        """Reserve ``num_bytes`` for ``request_id`` (or refuse), then the zeroed, writable
        per-layer buffers an incoming transfer of ``layout`` lands in. Both engines use it."""
        self.reserve(request_id, num_bytes)
        buffers = tuple(memoryview(bytearray(seg.num_bytes)) for seg in layout.segments)
        return Allocation(request_id, layout, buffers, num_bytes)
