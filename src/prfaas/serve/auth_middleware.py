"""``SignatureMiddleware``: the server half of signed control-plane calls (pure ASGI).

For each HTTP request it checks the signed headers first (``Verifier.authenticate``: format,
clock, start of the process, key id, signature over the declared body digest, nonce): a forged
call is refused (401) *before a byte of its body is read*, and its connection closed, so a flood of
forged calls with big bodies costs headers only. A call that verified tells its connection so
(``CONNECTION_EXTENSION``: the listener then takes it out of the quota of unverified connections,
``serve.listeners``). Its body is then streamed under ``max_body_bytes`` (413) and a deadline of
``body_timeout_s`` (408), hashed on the way, and compared with the signed digest (401
``body_mismatch``); only then does the app see it. Every answer to a verified call carries a MAC
under the call's key, bound to its nonce (``serve.answer_auth``).

Paths in ``exempt`` (a node's ``/health``) are served unsigned; a signed call to one is verified
and answered with a MAC like any other.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Protocol

from prfaas.serve.answer_auth import sign_answers
from prfaas.serve.auth import SIGNATURE_HEADER, Refusal, Verifier, refusal_body

MAX_BODY_BYTES = 64 << 20
"""Largest signed body a listener buffers (a 1M-token prefill command is about 5.6 MB)."""
BODY_TIMEOUT_S = 30.0
"""A verified call's whole body must arrive within this (from the end of its headers)."""
CONNECTION_EXTENSION = "prfaas.connection"
"""``scope["extensions"]`` key of the listener's handle on the request's connection."""

log = logging.getLogger("prfaas.auth")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ConnectionHandle(Protocol):
    def verified(self) -> None:
        """A call on this connection proved a key: it leaves the unverified quota."""


class SignatureMiddleware:
    """Refuses every HTTP request that is not signed with a key of the verifier's keyring (401),
    except the paths in ``exempt``. ``on_refused`` is told each refusal (a metrics counter)."""

    def __init__(
        self,
        app: ASGIApp,
        verifier: Verifier,
        exempt: Iterable[str] = (),
        max_body_bytes: int = MAX_BODY_BYTES,
        body_timeout_s: float = BODY_TIMEOUT_S,
        on_refused: Callable[[Refusal], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.verifier = verifier
        self.exempt = frozenset(exempt)
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.on_refused = on_refused
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        exempt = scope["path"] in self.exempt
        if exempt and SIGNATURE_HEADER not in headers:
            await self.app(scope, receive, send)
            return
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        method = scope["method"].encode()
        result = self.verifier.authenticate(method, target, headers, self._clock())
        if isinstance(result, Refusal):
            if exempt:  # an open route: served, its answer not authenticated
                await self.app(scope, receive, send)
                return
            await self._refuse(result, send, scope)
            return
        handle = scope.get("extensions", {}).get(CONNECTION_EXTENSION)
        if handle is not None:
            handle.verified()
        declared = headers.get("content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(_too_large(self.max_body_bytes), send, scope, status=413)
            return
        try:
            async with asyncio.timeout(self.body_timeout_s):
                got = await _read_body(receive, self.max_body_bytes)
        except TimeoutError:
            why = f"the body did not arrive within {self.body_timeout_s:g} s"
            await self._refuse(Refusal("body_timeout", why), send, scope, status=408)
            return
        if got is None:
            return  # the client went away: nobody to answer
        body, digest = got
        if digest is None:
            await self._refuse(_too_large(self.max_body_bytes), send, scope, status=413)
            return
        refusal = self.verifier.verify_body(result, digest)
        if refusal is not None:
            await self._refuse(refusal, send, scope)
            return
        await self.app(scope, _replay(body, receive), sign_answers(send, result.key, result.nonce))

    async def _refuse(self, refusal: Refusal, send: Send, scope: Scope, status: int = 401) -> None:
        self.verifier.note(refusal)
        n = self.verifier.num_refused
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th...: visible, but a flood cannot fill the log
            log.warning(
                "refused %s %s from %s: %s (%d refused so far)",
                scope["method"], scope["path"], scope.get("client"), refusal.code, n,
            )  # fmt: skip
        if self.on_refused is not None:
            self.on_refused(refusal)
        body = refusal_body(refusal)
        # Closed after the answer: the unread rest of a refused body is never read.
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": body})


def _too_large(limit_bytes: int) -> Refusal:
    return Refusal("body_too_large", f"body over {limit_bytes} bytes", "content-length")


def _headers(scope: Scope) -> dict[str, bytes]:
    """Header name -> value; a header sent twice keeps its first value (then cannot match)."""
    out: dict[str, bytes] = {}
    for name, value in scope["headers"]:
        out.setdefault(name.decode("latin-1").lower(), value)
    return out


async def _read_body(receive: Receive, limit_bytes: int) -> tuple[bytes, bytes | None] | None:
    """(the body, its hex SHA-256), with no digest past ``limit_bytes``; None when the client went
    away."""
    parts: list[bytes] = []
    hasher = hashlib.sha256()
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            return b"", None
        hasher.update(chunk)
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts), hasher.hexdigest().encode()


def _replay(body: bytes, receive: Receive) -> Receive:
    """The app reads the verified body first, then the connection's own events (disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
