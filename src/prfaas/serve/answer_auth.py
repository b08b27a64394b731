"""Authenticated answers: a MAC over every answer to a signed control-plane call, bound to the
call's nonce, so a man in the middle can neither forge an answer (a decode node's tokens, a
prefill outcome, a heartbeat's acknowledgement) nor replay one onto another call.

Two shapes, chosen by the server from the answer's media type:

- a whole body (JSON): header ``x-prfaas-answer-mac`` = hex HMAC-SHA256(key, label, nonce, status,
  SHA-256 of the body);
- a stream of lines (``application/x-ndjson``: the decode stream): header
  ``x-prfaas-answer-lines: 1`` and every line sent as ``<64 hex MAC> <line>\\n``, the MAC over the
  label, the nonce, the status, the line's index and the line: lines cannot be reordered, dropped
  from the middle or moved to another stream (a cut end shows as a stream without its last event).

``key`` is the key the call was verified with (the caller signed with it, so it holds it).
``sign_answers`` is the server half (wraps an ASGI ``send``); ``verify_answer`` the client half
(wraps an ``httpx`` response's byte stream; ``serve.auth.SignedAuth`` applies it to every signed
call).
An answer with an error status (4xx/5xx) and no MAC passes through unverified: it can only fail
the call, as cutting the connection could; a 2xx answer without one, or any MAC that does not
match, raises ``AnswerNotAuthentic``. No knowledge of requests' signatures here.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import httpx

ANSWER_MAC_HEADER = "x-prfaas-answer-mac"
ANSWER_LINES_HEADER = "x-prfaas-answer-lines"
_BODY_LABEL = b"PRFAAS-ANSWER-V1"
_LINE_LABEL = b"PRFAAS-ANSWER-LINE-V1"
_LINE_MEDIA_TYPE = b"application/x-ndjson"
MAC_HEX_CHARS = 64

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


class AnswerNotAuthentic(httpx.DecodingError):
    """An answer to a signed call that does not carry a valid MAC under the call's key."""


def body_mac(key: bytes, nonce: bytes, status: int, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest().encode()
    msg = b"\n".join((_BODY_LABEL, nonce, str(status).encode(), digest))
    return hmac.new(key, msg, hashlib.sha256).hexdigest().encode()


def line_mac(key: bytes, nonce: bytes, status: int, index: int, line: bytes) -> bytes:
    head = b"\n".join((_LINE_LABEL, nonce, str(status).encode(), str(index).encode(), b""))
    return hmac.new(key, head + line, hashlib.sha256).hexdigest().encode()


def sign_answers(send: Send, key: bytes, nonce: bytes) -> Send:
    """``send`` with every answer MACed: whole bodies are held until complete (the MAC goes in a
    header); NDJSON streams go out line by line, each with its MAC in front."""
    status = 0
    start: Message | None = None
    parts: list[bytes] = []
    lines = False
    pending = b""
    index = 0

    def signed_lines(data: bytes, last: bool) -> bytes:
        nonlocal pending, index
        pending += data
        *complete, pending = pending.split(b"\n")
        if last and pending:  # an unterminated last line is still a line
            complete.append(pending)
            pending = b""
        out = []
        for line in complete:
            out.append(line_mac(key, nonce, status, index, line) + b" " + line + b"\n")
            index += 1
        return b"".join(out)

    async def signed_send(message: Message) -> None:
        nonlocal status, start, lines
        kind = message["type"]
        if kind == "http.response.start":
            status = int(message["status"])
            headers = list(message.get("headers", []))
            media = next((v for k, v in headers if k.lower() == b"content-type"), b"")
            if media.split(b";")[0].strip().lower() == _LINE_MEDIA_TYPE:
                lines = True
                headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                headers.append((ANSWER_LINES_HEADER.encode(), b"1"))
                await send({**message, "headers": headers})
            else:
                start = {**message, "headers": headers}
            return
        if kind != "http.response.body":
            await send(message)
            return
        body, more = message.get("body", b""), bool(message.get("more_body", False))
        if lines:
            await send({"type": "http.response.body", "body": signed_lines(body, not more),
                        "more_body": more})  # fmt: skip
            return
        parts.append(body)
        if more:
            return
        assert start is not None, "a body before its start"
        whole = b"".join(parts)
        mac = body_mac(key, nonce, status, whole)
        await send({**start, "headers": [*start["headers"], (ANSWER_MAC_HEADER.encode(), mac)]})
        await send({"type": "http.response.body", "body": whole, "more_body": False})

    return signed_send


def verify_answer(response: httpx.Response, key: bytes, nonce: bytes) -> None:
    """Check ``response`` as it is read: replaces its byte stream with one that yields only what
    verified (lines without their MACs); raises ``AnswerNotAuthentic`` now for a 2xx answer that
    carries no MAC, or while reading for a MAC that does not match."""
    status = response.status_code
    mac = response.headers.get(ANSWER_MAC_HEADER)
    if response.headers.get(ANSWER_LINES_HEADER) == "1":
        response.stream = _VerifiedStream(response.stream, LineCheck(key, nonce, status))
    elif mac is not None:
        check = BodyCheck(key, nonce, status, mac.encode())
        response.stream = _VerifiedStream(response.stream, check)
    elif status >= 400:
        return  # an unauthenticated refusal can only fail the call (see the module docstring)
    else:
        raise AnswerNotAuthentic(
            f"{status} answer from {response.request.url} carries no {ANSWER_MAC_HEADER}: not "
            "from a holder of the deployment's key (a man in the middle, or an older prfaas)",
            request=response.request,
        )


class BodyCheck:
    """Holds a whole body until its end, then checks its MAC and hands it on."""

    def __init__(self, key: bytes, nonce: bytes, status: int, mac: bytes) -> None:
        self._args = key, nonce, status
        self._mac = mac
        self._parts: list[bytes] = []

    def feed(self, chunk: bytes) -> bytes:
        self._parts.append(chunk)
        return b""

    def end(self) -> bytes:
        body = b"".join(self._parts)
        if not hmac.compare_digest(body_mac(*self._args, body), self._mac):
            raise AnswerNotAuthentic(f"answer MAC does not match ({ANSWER_MAC_HEADER}): altered")
        return body


class LineCheck:
    """Checks each complete line as it arrives and hands on the line without its MAC."""

    def __init__(self, key: bytes, nonce: bytes, status: int) -> None:
        self._key, self._nonce, self._status = key, nonce, status
        self._pending = b""
        self._index = 0

    def feed(self, chunk: bytes) -> bytes:
        self._pending += chunk
        *complete, self._pending = self._pending.split(b"\n")
        return b"".join(self._line(x) for x in complete)

    def _line(self, signed: bytes) -> bytes:
        mac, _, line = signed.partition(b" ")
        expected = line_mac(self._key, self._nonce, self._status, self._index, line)
        if len(mac) != MAC_HEX_CHARS or not hmac.compare_digest(expected, mac):
            raise AnswerNotAuthentic(
                f"line {self._index} of the answer stream: MAC does not match (altered, "
                "reordered or from another call)"
            )
        self._index += 1
        return line + b"\n"

    def end(self) -> bytes:
        if self._pending:
            raise AnswerNotAuthentic("the answer stream ended inside a line")
        return b""


class _VerifiedStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    def __init__(self, inner: Any, check: BodyCheck | LineCheck) -> None:
        self._inner = inner
        self._check = check

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            out = self._check.feed(chunk)
            if out:
                yield out
        out = self._check.end()
        if out:
            yield out

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            out = self._check.feed(chunk)
            if out:
                yield out
        out = self._check.end()
        if out:
            yield out

    def close(self) -> None:
        if isinstance(self._inner, httpx.SyncByteStream):
            self._inner.close()

    async def aclose(self) -> None:
        if isinstance(self._inner, httpx.AsyncByteStream):
            await self._inner.aclose()
