"""``NodeClient``: the gateway's calls to node processes, behind one small interface, so the
dispatcher's decisions and bookkeeping can be tested against in-memory nodes (no sockets).

``HttpNodeClient`` is the live implementation (httpx, signed when given an ``auth``). Every failure
comes out as one ``NodeCallFailed`` whose ``kind`` says what it means for rotation:

- ``unreachable``: no answer (connect refused or timed out, connection reset, stream cut): the node
  may be dead; the registry quarantines it until a heartbeat proves otherwise.
- ``refused``: the node answered 409 (draining, changing role): not now, try another node.
- ``rejected``: any other non-200 answer, or an answer that does not parse: this request failed
  there; the node stays in rotation.
- ``closed``: a decode stream ended before its last token.
- ``handed_back``: a prefill node under a spot notice gave the request back (its outcome says
  so): serve it on another node, not locally; the node is leaving.

An answer that is not authenticated under the deployment's key (``serve.answer_auth``: forged or
altered on the way) is ``rejected``, its message saying so. A decode stream's lines are split on
``\n`` only (``serve.http_lines``): an event's text may carry U+0085, U+2028 or U+2029 raw, which
httpx's ``aiter_lines`` would split inside the JSON.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Literal, Protocol

import httpx

from prfaas.serve.answer_auth import AnswerNotAuthentic
from prfaas.serve.control_tls import ControlTLS, client_options, scheme
from prfaas.serve.http_lines import aiter_lines
from prfaas.serve.node.messages import (
    DecodeCommand,
    DecodeEvent,
    NodeEndpoint,
    PrefillCommand,
    PrefillOutcome,
    PrefillStep,
    PrefixPullCommand,
)

FailureKind = Literal["unreachable", "refused", "rejected", "closed", "handed_back"]
ABORT_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 5.0


class NodeCallFailed(Exception):
    def __init__(self, node: str, kind: FailureKind, message: str) -> None:
        super().__init__(f"node {node}: {message}")
        self.node = node
        self.kind: FailureKind = kind


class NodeClient(Protocol):
    def decode(
        self, ep: NodeEndpoint, cmd: DecodeCommand
    ) -> AbstractAsyncContextManager[AsyncIterator[DecodeEvent]]:
        """Open the node's decode stream for ``cmd``: its events, first ``ready``. Iterating raises
        ``NodeCallFailed`` (``closed`` when the stream ends without a finished event)."""
        ...

    async def prefill(self, ep: NodeEndpoint, cmd: PrefillCommand) -> PrefillOutcome:
        """Run the prefill; returns once the node has its outcome (the KV verified at the decode
        node, or why not)."""
        ...

    async def abort(self, ep: NodeEndpoint, request_id: str) -> None:
        """Best effort: cancel a running prefill (never raises)."""
        ...

    async def pull_prefix(self, dst: NodeEndpoint, cmd: PrefixPullCommand) -> bool:
        """Ask ``dst`` to fetch a prefix from ``cmd.src_url``; False when it did not."""
        ...

    def base_url(self, ep: NodeEndpoint) -> str: ...

    async def aclose(self) -> None: ...


KEEPALIVE = 64
"""Idle connections kept for reuse after a burst (the rest close)."""


class HttpNodeClient:
    def __init__(self, auth: httpx.Auth | None = None, tls: ControlTLS | None = None) -> None:
        """``tls``: the control plane's (``tls.control_plane``): nodes are called over HTTPS and
        their certificate verified; None: plain HTTP."""
        self._scheme = scheme(tls)
        # No cap on connections: each admitted request holds a decode stream open until its KV
        # lands and needs a second connection for the prefill that sends it, so a pool smaller
        # than twice the requests in flight deadlocks (httpx's default of 100 timed out 135 of
        # 160 concurrent requests). The gateway's admission (max_inflight) is the bound.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            auth=auth,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=KEEPALIVE),
            **client_options(tls),
        )

    def base_url(self, ep: NodeEndpoint) -> str:
        return f"{self._scheme}://{ep.host}:{ep.http_port}"

    @asynccontextmanager
    async def decode(
        self, ep: NodeEndpoint, cmd: DecodeCommand
    ) -> AsyncIterator[AsyncIterator[DecodeEvent]]:
        url = f"{self.base_url(ep)}/nodes/{ep.node}/decode"
        with _call_failures(ep.node):
            async with self._client.stream("POST", url, json=cmd.model_dump()) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise _answer_failure(ep.node, resp)
                async with contextlib.aclosing(_events(ep.node, aiter_lines(resp))) as events:
                    yield events

    async def prefill(self, ep: NodeEndpoint, cmd: PrefillCommand) -> PrefillOutcome:
        url = f"{self.base_url(ep)}/nodes/{ep.node}/prefill"
        with _call_failures(ep.node):
            resp = await self._client.post(url, json=cmd.model_dump())
        if resp.status_code != 200:
            raise _answer_failure(ep.node, resp)
        try:
            return PrefillOutcome.model_validate_json(resp.content)
        except ValueError as exc:
            raise NodeCallFailed(ep.node, "rejected", f"unreadable outcome: {exc}") from None

    async def prefill_streamed(
        self, ep: NodeEndpoint, cmd: PrefillCommand, computed: Callable[[], None]
    ) -> PrefillOutcome:
        """``prefill`` through ``/nodes/{node}/prefill/stream``: ``computed()`` is called when
        the node says it computed the prefill and handed its KV to the link (before the
        receiver verified it); returns the outcome. A stream cut before the outcome is
        ``unreachable``: the node is lost, whatever it said before."""
        url = f"{self.base_url(ep)}/nodes/{ep.node}/prefill/stream"
        with _call_failures(ep.node):
            async with self._client.stream("POST", url, json=cmd.model_dump()) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise _answer_failure(ep.node, resp)
                async for line in aiter_lines(resp):
                    if not line.strip():
                        continue
                    try:
                        step = PrefillStep.model_validate_json(line)
                    except ValueError as exc:
                        raise NodeCallFailed(
                            ep.node, "rejected", f"garbled prefill step: {exc}"
                        ) from None
                    if step.kind == "outcome" and step.outcome is not None:
                        return step.outcome
                    if step.kind == "computed":
                        computed()
        raise NodeCallFailed(ep.node, "unreachable", "the prefill stream ended before its outcome")

    async def abort(self, ep: NodeEndpoint, request_id: str) -> None:
        url = f"{self.base_url(ep)}/nodes/{ep.node}/abort/{request_id}"
        # The node may be gone or slow: its own deadlines free the request then.
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post(url, timeout=ABORT_TIMEOUT_S)

    async def pull_prefix(self, dst: NodeEndpoint, cmd: PrefixPullCommand) -> bool:
        try:
            r = await self._client.post(
                f"{self.base_url(dst)}/prefix/pull",
                json=cmd.model_dump(),
                timeout=cmd.timeout_s + 5.0,
            )
            return r.status_code == 200 and bool(r.json().get("ok"))
        except (httpx.HTTPError, ValueError):
            return False

    async def aclose(self) -> None:
        await self._client.aclose()


def _answer_failure(node: str, resp: httpx.Response) -> NodeCallFailed:
    detail = resp.text[:200]
    kind: FailureKind = "refused" if resp.status_code == 409 else "rejected"
    return NodeCallFailed(node, kind, f"HTTP {resp.status_code}: {detail}")


@contextlib.contextmanager
def _call_failures(node: str) -> Iterator[None]:
    """A node call's transport failures as ``NodeCallFailed``: an answer whose MAC does not
    verify is ``rejected``, an HTTP error ``unreachable``."""
    try:
        yield
    except AnswerNotAuthentic as exc:
        raise NodeCallFailed(node, "rejected", f"unauthenticated answer: {exc}") from None
    except httpx.HTTPError as exc:
        raise NodeCallFailed(node, "unreachable", f"{type(exc).__name__}: {exc}") from None


async def _events(node: str, lines: AsyncIterator[str]) -> AsyncGenerator[DecodeEvent, None]:
    with _call_failures(node):
        async for line in lines:
            if not line.strip():
                continue
            try:
                event = DecodeEvent.model_validate(json.loads(line))
            except ValueError as exc:
                raise NodeCallFailed(node, "rejected", f"garbled decode event: {exc}") from None
            if any(t < 0 for t in event.token_ids):  # the detokenizer would raise on it: a 500
                raise NodeCallFailed(node, "rejected", f"token id < 0 in {event.token_ids}")
            yield event
            if event.finish_reason is not None or event.kind == "error":
                return
    raise NodeCallFailed(node, "closed", "the decode stream ended before its last token")
