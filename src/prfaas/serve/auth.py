"""Signed control-plane calls: HMAC-SHA256 from the deployment's PSK over each HTTP request.

Every call between the deployment's own processes (register, heartbeat, the gateway's control
listener, every worker HTTP API) carries three headers::

    X-Prfaas-Timestamp  wall-clock seconds since the epoch, when the caller signed ("%.3f")
    X-Prfaas-Nonce      32 hex digits, random per request
    X-Prfaas-Signature  hex HMAC-SHA256(psk, canonical request)

The canonical request is ``SCHEME`` + method + Host header + path with query + timestamp + nonce +
SHA-256 of the body, one per line: a signature binds one call to one destination, one body and one
moment. The receiver (``Verifier``) checks it in constant time (``hmac.compare_digest``), refuses
timestamps more than ``window_s`` (30 s) from its own clock, and refuses a nonce it has already
accepted. Seen nonces are remembered only while their timestamp is inside the window, and at most
``max_nonces`` of them; when that many are held the oldest is forgotten and the *floor* rises to its
timestamp: a request signed at or before the floor is refused, so a forgotten nonce can never be
replayed (only holders of the key can fill the table: a nonce is recorded after its signature
verified). Processes' clocks must agree to within the window (NTP).

``SignedAuth`` is the client half (an ``httpx.Auth``); ``SignatureMiddleware`` the server half (pure
ASGI: it checks the headers before reading the body, buffers at most ``max_body_bytes``, then hands
the app the same body). A refusal is a 401 with an OpenAI-style error body naming the header; each
is counted by reason.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import json
import logging
import math
import re
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import httpx

SCHEME = b"PRFAAS-HMAC-SHA256"
TIMESTAMP_HEADER = "x-prfaas-timestamp"
NONCE_HEADER = "x-prfaas-nonce"
SIGNATURE_HEADER = "x-prfaas-signature"
WINDOW_S = 30.0
MAX_NONCES = 200_000
"""Nonces held at most (about 30 MB): above 6,000 signed calls/s for a whole window."""
MAX_BODY_BYTES = 64 << 20
"""Largest signed body a listener buffers (a 1M-token prefill command is about 5.6 MB)."""

_TIMESTAMP = re.compile(rb"^[0-9]{1,12}(\.[0-9]{1,6})?$")
_NONCE = re.compile(rb"^[0-9a-f]{32}$")
_SIGNATURE = re.compile(rb"^[0-9a-f]{64}$")

log = logging.getLogger("prfaas.auth")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def canonical_request(
    method: bytes, host: bytes, target: bytes, timestamp: bytes, nonce: bytes, body: bytes
) -> bytes:
    """What is signed. ``target`` is the path as sent on the wire, with ``?query`` if any."""
    digest = hashlib.sha256(body).hexdigest().encode()
    return b"\n".join((SCHEME, method.upper(), host.lower(), target, timestamp, nonce, digest))


def signature(psk: bytes, canonical: bytes) -> bytes:
    return hmac.new(psk, canonical, hashlib.sha256).hexdigest().encode()


def signed_headers(
    psk: bytes,
    method: str,
    host: str,
    target: str,
    body: bytes,
    now_s: float,
    nonce: str | None = None,
) -> dict[str, str]:
    """The three headers for one request (``nonce`` drawn at random unless given)."""
    timestamp = f"{now_s:.3f}"
    nonce = nonce if nonce is not None else secrets.token_hex(16)
    canonical = canonical_request(
        method.encode(), host.encode(), target.encode(), timestamp.encode(), nonce.encode(), body
    )
    return {
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: signature(psk, canonical).decode(),
    }


class SignedAuth(httpx.Auth):
    """Signs every request of an ``httpx`` client with the deployment's key."""

    requires_request_body = True

    def __init__(self, psk: bytes) -> None:
        if not psk:
            raise ValueError("SignedAuth needs the deployment's psk")
        self._psk = psk

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        headers = signed_headers(
            self._psk,
            request.method,
            request.headers["host"],
            request.url.raw_path.decode("ascii"),
            request.content,
            time.time(),
        )
        request.headers.update(headers)
        yield request


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused: ``code`` for counters and clients, ``message`` for people."""

    code: str
    message: str
    header: str = SIGNATURE_HEADER


class Verifier:
    """The server half: checks signatures and remembers accepted nonces (bounded)."""

    def __init__(
        self, psk: bytes, window_s: float = WINDOW_S, max_nonces: int = MAX_NONCES
    ) -> None:
        if not psk:
            raise ValueError("Verifier needs the deployment's psk")
        if window_s <= 0 or max_nonces < 1:
            raise ValueError(f"window_s={window_s} and max_nonces={max_nonces} must be positive")
        self._psk = psk
        self.window_s = window_s
        self.max_nonces = max_nonces
        self._seen: set[bytes] = set()
        self._by_time: list[tuple[float, bytes]] = []  # heap of (timestamp, nonce)
        self.floor_s = -math.inf
        """Requests signed at or before this are refused: their nonce may have been forgotten."""
        self.refused: Counter[str] = Counter()

    @property
    def num_refused(self) -> int:
        return sum(self.refused.values())

    @property
    def num_nonces(self) -> int:
        return len(self._seen)

    def check_headers(self, headers: Mapping[str, bytes], now_s: float) -> Refusal | None:
        """The checks that need no body (run first, so an unsigned caller costs no buffering)."""
        ts, nonce, sig = (
            headers.get(h) for h in (TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER)
        )
        if ts is None or nonce is None or sig is None:
            missing = next(
                h for h, v in zip(
                    (TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER), (ts, nonce, sig),
                    strict=True,
                ) if v is None
            )  # fmt: skip
            return Refusal("missing_signature", f"unsigned request: no {missing} header", missing)
        if not _TIMESTAMP.match(ts):
            return Refusal("malformed_signature", "timestamp is not seconds", TIMESTAMP_HEADER)
        if not _NONCE.match(nonce):
            return Refusal("malformed_signature", "nonce is not 32 hex digits", NONCE_HEADER)
        if not _SIGNATURE.match(sig):
            return Refusal("malformed_signature", "signature is not 64 hex digits")
        skew_s = float(ts) - now_s
        if abs(skew_s) > self.window_s:
            return Refusal(
                "stale_timestamp",
                f"timestamp {skew_s:+.1f} s from this server's clock (limit +-{self.window_s:g} s)",
                TIMESTAMP_HEADER,
            )
        return None

    def verify(
        self,
        method: bytes,
        target: bytes,
        headers: Mapping[str, bytes],
        body: bytes,
        now_s: float,
    ) -> Refusal | None:
        """None when the request is authentic and fresh (its nonce is then remembered)."""
        refusal = self.check_headers(headers, now_s)
        if refusal is not None:
            return refusal
        ts, nonce = headers[TIMESTAMP_HEADER], headers[NONCE_HEADER]
        host = headers.get("host", b"")
        expected = signature(self._psk, canonical_request(method, host, target, ts, nonce, body))
        if not hmac.compare_digest(expected, headers[SIGNATURE_HEADER]):
            return Refusal("bad_signature", "signature does not match (wrong key or altered)")
        self._expire(now_s)
        ts_s = float(ts)
        if nonce in self._seen or ts_s <= self.floor_s:
            return Refusal("replayed", "nonce already used (a replayed request)", NONCE_HEADER)
        self._remember(ts_s, nonce)
        return None

    def note(self, refusal: Refusal) -> None:
        self.refused[refusal.code] += 1

    def _expire(self, now_s: float) -> None:
        # A nonce whose timestamp left the window cannot come back: the skew check refuses it.
        horizon = now_s - self.window_s
        while self._by_time and self._by_time[0][0] < horizon:
            _, old = heapq.heappop(self._by_time)
            self._seen.discard(old)

    def _remember(self, ts_s: float, nonce: bytes) -> None:
        while len(self._seen) >= self.max_nonces:
            oldest_s, old = heapq.heappop(self._by_time)
            self._seen.discard(old)
            self.floor_s = max(self.floor_s, oldest_s)
        heapq.heappush(self._by_time, (ts_s, nonce))
        self._seen.add(nonce)


def refusal_body(refusal: Refusal) -> bytes:
    """The OpenAI-style error body of a 401."""
    error = {
        "message": f"control-plane authentication failed: {refusal.message}",
        "type": "authentication_error",
        "param": refusal.header,
        "code": refusal.code,
    }
    return json.dumps({"error": error}).encode()


class SignatureMiddleware:
    """Refuses every HTTP request that is not signed with the deployment's key (401), except the
    paths in ``exempt``. ``on_refused`` is told each refusal (a metrics counter, say)."""

    def __init__(
        self,
        app: ASGIApp,
        verifier: Verifier,
        exempt: Iterable[str] = (),
        max_body_bytes: int = MAX_BODY_BYTES,
        on_refused: Callable[[Refusal], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.verifier = verifier
        self.exempt = frozenset(exempt)
        self.max_body_bytes = max_body_bytes
        self.on_refused = on_refused
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        refusal = self.verifier.check_headers(headers, self._clock())
        if refusal is not None:
            await self._refuse(refusal, send, scope)
            return
        body = await _read_body(receive, self.max_body_bytes)
        if body is _GONE:
            return  # the client went away: nobody to answer
        if body is None:
            refusal = Refusal("body_too_large", f"body over {self.max_body_bytes} bytes")
            await self._refuse(refusal, send, scope, status=413)
            return
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        refusal = self.verifier.verify(
            scope["method"].encode(), target, headers, body, self._clock()
        )
        if refusal is not None:
            await self._refuse(refusal, send, scope)
            return
        await self.app(scope, _replay(body, receive), send)

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
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": body})


def _headers(scope: Scope) -> dict[str, bytes]:
    """Header name -> value; a header sent twice keeps its first value (then cannot match)."""
    out: dict[str, bytes] = {}
    for name, value in scope["headers"]:
        out.setdefault(name.decode("latin-1").lower(), value)
    return out


_GONE = b"\x00gone"  # identity-compared sentinel: the client disconnected mid-body


async def _read_body(receive: Receive, limit_bytes: int) -> bytes | None:
    """The whole body; None past ``limit_bytes``; ``_GONE`` when the client went away."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return _GONE
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


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
