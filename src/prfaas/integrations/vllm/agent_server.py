"""``AgentServer``: the connector's agent socket, served by the transfer thread's event loop inside
the vLLM Worker process for the sidecar (``serve.vllm.agent.AgentClient`` is the other end).

A unix stream socket (mode 0600, replaced if a stale one is there), one JSON object per line each
way, any number of requests per connection. The ops and what their fields must be are checked
here; what they do is the transfer thread's (``AgentOps``). A request that is not JSON, names an
unknown op or gives a bad field is answered ``{"error": "bad request: ..."}`` and the connection
goes on (a JSON value that is not an object too: it used to end the connection with an
AttributeError logged by the loop). Imports neither torch nor vllm.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

OPS = ("wait_sent", "abort", "stats", "set_pace", "load_result")


@dataclass(frozen=True, slots=True)
class AgentOps:
    """What each op does (the transfer thread's methods, run in its loop)."""

    wait_sent: Callable[[str, float], Awaitable[dict[str, Any]]]
    """(transfer id, timeout_s) -> ``{"state", "kv_bytes", "error"}``."""
    abort: Callable[[str], bool]
    """Drop a transfer (either side); whether there was one."""
    stats: Callable[[], dict[str, Any]]
    set_pace: Callable[[float], dict[str, Any]]
    """Pace the cross-site sends at this many Gbps (> 0) from now on -> ``{"pace_gbps"}``."""
    load_result: Callable[[str], dict[str, Any]]
    """(transfer id) -> ``{"state": "installed" | "recomputed" | "unknown"}``: what the decode
    side did with that request's KV (recomputed: the load failed and vLLM recomputed)."""


class AgentServer:
    def __init__(self, path: str, ops: AgentOps) -> None:
        self.path = path
        self._ops = ops
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._client, self.path)
        os.chmod(self.path, 0o600)

    async def aclose(self) -> None:
        """Stop serving and end the connections still open (a sidecar's idle one waits in
        ``readline``: left pending, its task was destroyed with the loop, and said so)."""
        if self._server is None:
            return
        self._server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        for task in list(self._clients):
            task.cancel()
        for task in list(self._clients):
            with contextlib.suppress(BaseException):
                await task

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            while line := await reader.readline():
                try:
                    answer = await self._op(json.loads(line))
                except (ValueError, TypeError, KeyError) as exc:
                    answer = {"error": f"bad request: {exc}"}
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            # Only aclose cancels: end quietly (asyncio's server callback reads the task's
            # exception, and a cancelled task's raises there).
            pass
        finally:
            writer.close()
            if task is not None:
                self._clients.discard(task)

    async def _op(self, req: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(req, dict):
            raise ValueError(f"expected a JSON object, got {req!r:.100}")
        op = req.get("op")
        if op == "stats":
            return self._ops.stats()
        if op == "set_pace":
            gbps = req.get("gbps")
            if isinstance(gbps, bool) or not isinstance(gbps, int | float):
                raise ValueError(f"gbps must be a number, got {gbps!r}")
            if not 0 < gbps < math.inf:
                raise ValueError(f"gbps must be finite and > 0, got {gbps!r}")
            return self._ops.set_pace(float(gbps))
        tid = req.get("transfer_id")
        if not isinstance(tid, str) or not tid:
            raise ValueError(f"transfer_id must be a non-empty string, got {tid!r}")
        if op == "abort":
            return {"aborted": self._ops.abort(tid)}
        if op == "load_result":
            return self._ops.load_result(tid)
        if op == "wait_sent":
            timeout = req.get("timeout_s", 30.0)
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
                raise ValueError(f"timeout_s must be > 0, got {timeout!r}")
            return await self._ops.wait_sent(tid, float(timeout))
        raise ValueError(f"unknown op {op!r} (known: {', '.join(OPS)})")
