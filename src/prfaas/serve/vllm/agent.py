"""``AgentClient``: the sidecar's side of the connector's agent socket (a unix stream socket the
connector's worker side serves inside the vLLM Worker process; one JSON object per line each way).
``wait_sent`` tells whether a prefill's KV reached its decode node verified, ``abort`` drops a
transfer, ``stats`` gives the transfer counters for the node reports and the connector's reading
of each destination link (``core.SenderLinkReport``: pace, capacity estimate, backlog, RTT) for
the heartbeat, ``set_pace`` re-paces the cross-site sends (``POST /link/rate``).

One connection per call: ``wait_sent`` may wait as long as a transfer takes while heartbeats ask
for ``stats``, and a unix connect costs microseconds. Must not import vllm.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Literal

from prfaas.core.link_report import SenderLinkReport

SendState = Literal["verified", "failed", "unknown", "timeout"]
CALL_MARGIN_S = 5.0
"""On top of a ``wait_sent``'s own timeout: the agent answers "timeout" itself first."""
SHORT_CALL_S = 5.0
MAX_LINE_BYTES = 1 << 20


class AgentError(Exception):
    """The agent could not be asked (no socket yet, refused, closed, a bad answer)."""


@dataclass(frozen=True, slots=True)
class SendResult:
    state: SendState
    kv_bytes: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class AgentStats:
    links: tuple[SenderLinkReport, ...] = ()
    """The connector's reading of each destination link (real bytes, wall seconds)."""
    cross_site_bytes: int = 0
    """Bytes the cross-site senders accepted so far, piece by piece."""
    cross_site_unsent_bytes: int = 0
    """Bytes of open cross-site sends not yet accepted by the senders."""
    handshake_failures: int = 0
    staged_bytes: int = 0
    sessions_sent: int = 0
    sessions_received: int = 0
    loads_ok: int = 0
    loads_failed: int = 0

    def link(self, name: str) -> SenderLinkReport | None:
        """The reading of destination link ``name`` (None: the connector has none)."""
        return next((r for r in self.links if r.link == name), None)

    @classmethod
    def from_json(cls, a: dict[str, Any]) -> AgentStats:
        """The agent's ``stats`` answer; a ``ValueError`` names what is wrong."""
        links = a.get("links", [])
        if not isinstance(links, list):
            raise ValueError(f"links must be a list, got {links!r:.100}")
        counts = {f: _count(a, f) for f in _COUNTS}
        return cls(tuple(SenderLinkReport.from_json(r) for r in links), **counts)


_COUNTS = (
    "cross_site_bytes", "cross_site_unsent_bytes", "handshake_failures", "staged_bytes",
    "sessions_sent", "sessions_received", "loads_ok", "loads_failed",
)  # fmt: skip


def _count(a: dict[str, Any], key: str) -> int:
    value = a.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be a whole number >= 0, got {value!r}")
    return value


class AgentClient:
    def __init__(self, path: str) -> None:
        self.path = path

    async def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_unix_connection(self.path, limit=MAX_LINE_BYTES)
                try:
                    writer.write(json.dumps(request).encode() + b"\n")
                    await writer.drain()
                    line = await reader.readline()
                finally:
                    writer.close()
        except TimeoutError:
            raise AgentError(f"agent {self.path}: no answer to {request['op']} in time") from None
        except (OSError, ValueError) as exc:
            raise AgentError(f"agent {self.path}: {exc}") from None
        if not line:
            raise AgentError(f"agent {self.path} closed the connection")
        try:
            answer = json.loads(line)
        except ValueError:
            raise AgentError(f"agent {self.path}: not JSON: {line[:100]!r}") from None
        if not isinstance(answer, dict):
            raise AgentError(f"agent {self.path}: expected an object, got {answer!r:.100}")
        return answer

    async def wait_sent(self, transfer_id: str, timeout_s: float) -> SendResult:
        a = await self.call(
            {"op": "wait_sent", "transfer_id": transfer_id, "timeout_s": timeout_s},
            timeout_s + CALL_MARGIN_S,
        )
        state = a.get("state")
        if state not in ("verified", "failed", "unknown", "timeout"):
            raise AgentError(f"agent: wait_sent answered state {state!r}")
        return SendResult(state, int(a.get("kv_bytes") or 0), str(a.get("error") or ""))

    async def load_result(self, transfer_id: str) -> Literal["installed", "recomputed", "unknown"]:
        """What the decode server did with ``transfer_id``'s KV (after its decode): installed,
        recomputed (the load failed), unknown (no load counted: none was asked, or forgotten)."""
        a = await self.call({"op": "load_result", "transfer_id": transfer_id}, SHORT_CALL_S)
        state = a.get("state")
        if state not in ("installed", "recomputed", "unknown"):
            raise AgentError(f"agent: load_result answered {a!r:.200}")
        return state  # type: ignore[no-any-return]

    async def abort(self, transfer_id: str) -> bool:
        a = await self.call({"op": "abort", "transfer_id": transfer_id}, SHORT_CALL_S)
        return bool(a.get("aborted"))

    async def stats(self) -> AgentStats:
        a = await self.call({"op": "stats"}, SHORT_CALL_S)
        try:
            return AgentStats.from_json(a)
        except ValueError as exc:
            raise AgentError(f"agent: bad stats {a!r:.200}: {exc}") from None

    async def set_pace(self, gbps: float) -> float:
        """Pace the connector's cross-site sends at ``gbps`` from now on (its capacity estimate
        starts afresh from that rate); returns the pace the agent set."""
        a = await self.call({"op": "set_pace", "gbps": gbps}, SHORT_CALL_S)
        if "error" in a or not isinstance(a.get("pace_gbps"), int | float):
            raise AgentError(f"agent: set_pace answered {a!r:.200}")
        return float(a["pace_gbps"])
