"""Signed control-plane calls: HMAC-SHA256 under a key of the deployment's keyring over each HTTP
request, checked from the headers alone before the body is read.

Every call between the deployment's own processes (register, heartbeat, the gateway's control
listener, every worker HTTP API) carries five headers::

    X-Prfaas-Timestamp       wall-clock seconds since the epoch, when the caller signed ("%.3f")
    X-Prfaas-Nonce           32 hex digits, random per request
    X-Prfaas-Key-Id          which key of the keyring signed (``serve.keyring``)
    X-Prfaas-Content-Sha256  hex SHA-256 of the body
    X-Prfaas-Signature       hex HMAC-SHA256(key, canonical request)

The canonical request is ``SCHEME`` + method + Host header + path with query + timestamp + nonce +
key id + the body's SHA-256, one per line: a signature binds one call to one destination, one
body, one key and one moment. Because the body's digest is a signed header, the receiver
(``Verifier.authenticate``) checks the signature, the clock and the nonce before it reads a byte
of the body, then streams the body and compares its digest (``Verifier.verify_body``): a forged
call costs its headers, not its body. It compares in constant time, refuses timestamps more than
``window_s`` (30 s) from its own clock and calls signed before the process started (less
``start_skew_s``: a process restarted by its supervisor has an empty nonce memory, and must not
accept a call captured before the restart), and refuses a nonce it has already accepted. Seen
nonces are remembered while their timestamp is inside the window, at most ``max_nonces``; when
that many are held the oldest is forgotten and the *floor* rises to its timestamp: a request
signed at or before the floor is refused, so a forgotten nonce can never be replayed (only holders
of a key can fill the table: a nonce is recorded after its signature verified). Processes' clocks
must agree to within the window (NTP); a caller whose clock is behind by more than
``start_skew_s`` loses only its calls of that many seconds after a restart (it retries).

``SignedAuth`` is the client half (an ``httpx.Auth``: it also checks the MAC of every answer,
``serve.answer_auth``); ``serve.auth_middleware.SignatureMiddleware`` the server half. A refusal
is a 401 with an OpenAI-style error body naming the header; each is counted by reason.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import json
import math
import re
import secrets
import time
from collections import Counter
from collections.abc import Generator, Mapping
from dataclasses import dataclass

import httpx

from prfaas.serve.answer_auth import verify_answer
from prfaas.serve.keyring import KEY_ID, KeyringHolder, KeySource, holder_of, key_id_of

SCHEME = b"PRFAAS-HMAC-SHA256-V2"
TIMESTAMP_HEADER = "x-prfaas-timestamp"
NONCE_HEADER = "x-prfaas-nonce"
KEY_ID_HEADER = "x-prfaas-key-id"
CONTENT_SHA256_HEADER = "x-prfaas-content-sha256"
SIGNATURE_HEADER = "x-prfaas-signature"
SIGNED_HEADERS = (
    TIMESTAMP_HEADER, NONCE_HEADER, KEY_ID_HEADER, CONTENT_SHA256_HEADER, SIGNATURE_HEADER,
)  # fmt: skip
WINDOW_S = 30.0
START_SKEW_S = 1.0
"""Calls signed up to this long before the process started are still accepted (clock skew)."""
MAX_NONCES = 200_000
"""Nonces held at most (about 30 MB): above 6,000 signed calls/s for a whole window."""

_TIMESTAMP = re.compile(rb"^[0-9]{1,12}(\.[0-9]{1,6})?$")
_NONCE = re.compile(rb"^[0-9a-f]{32}$")
_HEX64 = re.compile(rb"^[0-9a-f]{64}$")


def canonical_request(
    method: bytes,
    host: bytes,
    target: bytes,
    timestamp: bytes,
    nonce: bytes,
    key_id: bytes,
    content_sha256: bytes,
) -> bytes:
    """What is signed. ``target`` is the path as sent on the wire, with ``?query`` if any."""
    return b"\n".join(
        (SCHEME, method.upper(), host.lower(), target, timestamp, nonce, key_id, content_sha256)
    )


def signature(key: bytes, canonical: bytes) -> bytes:
    return hmac.new(key, canonical, hashlib.sha256).hexdigest().encode()


def signed_headers(
    psk: bytes,
    method: str,
    host: str,
    target: str,
    body: bytes,
    now_s: float,
    nonce: str | None = None,
    key_id: str | None = None,
) -> dict[str, str]:
    """The signed headers for one request (``nonce`` drawn at random unless given; ``key_id`` the
    key's fingerprint unless given)."""
    timestamp = f"{now_s:.3f}"
    nonce = nonce if nonce is not None else secrets.token_hex(16)
    key_id = key_id if key_id is not None else key_id_of(psk)
    digest = hashlib.sha256(body).hexdigest()
    canonical = canonical_request(
        method.encode(), host.encode(), target.encode(), timestamp.encode(), nonce.encode(),
        key_id.encode(), digest.encode(),
    )  # fmt: skip
    return {
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        KEY_ID_HEADER: key_id,
        CONTENT_SHA256_HEADER: digest,
        SIGNATURE_HEADER: signature(psk, canonical).decode(),
    }


class SignedAuth(httpx.Auth):
    """Signs every request of an ``httpx`` client with the keyring's signing key, and verifies the
    MAC of every answer (``serve.answer_auth``) under the same key and the request's nonce."""

    requires_request_body = True

    def __init__(self, keys: KeySource) -> None:
        self._keys = holder_of(keys)

    @property
    def keys(self) -> KeyringHolder:
        return self._keys

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        ring = self._keys.ring
        key = ring.signing_key
        headers = signed_headers(
            key,
            request.method,
            request.headers["host"],
            request.url.raw_path.decode("ascii"),
            request.content,
            time.time(),
            key_id=ring.signing_id,
        )
        request.headers.update(headers)
        response = yield request
        verify_answer(response, key, headers[NONCE_HEADER].encode())


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused: ``code`` for counters and clients, ``message`` for people."""

    code: str
    message: str
    header: str = SIGNATURE_HEADER


@dataclass(frozen=True, slots=True)
class Verified:
    """A request whose signed headers verified: its body must still hash to ``content_sha256``."""

    key_id: str
    key: bytes
    nonce: bytes
    content_sha256: bytes


class Verifier:
    """The server half: checks signatures and remembers accepted nonces (bounded)."""

    def __init__(
        self,
        keys: KeySource,
        window_s: float = WINDOW_S,
        max_nonces: int = MAX_NONCES,
        started_at_s: float | None = None,
        start_skew_s: float = START_SKEW_S,
    ) -> None:
        if window_s <= 0 or max_nonces < 1 or start_skew_s < 0:
            raise ValueError(
                f"window_s={window_s}, max_nonces={max_nonces} must be positive and "
                f"start_skew_s={start_skew_s} not negative"
            )
        self.keys = holder_of(keys)
        self.window_s = window_s
        self.max_nonces = max_nonces
        self.started_at_s = time.time() if started_at_s is None else started_at_s
        self.start_skew_s = start_skew_s
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
        """The checks that need no key: every header there and well formed, the clock."""
        missing = next((h for h in SIGNED_HEADERS if headers.get(h) is None), None)
        if missing is not None:
            return Refusal("missing_signature", f"unsigned request: no {missing} header", missing)
        ts = headers[TIMESTAMP_HEADER]
        if not _TIMESTAMP.match(ts):
            return Refusal("malformed_signature", "timestamp is not seconds", TIMESTAMP_HEADER)
        if not _NONCE.match(headers[NONCE_HEADER]):
            return Refusal("malformed_signature", "nonce is not 32 hex digits", NONCE_HEADER)
        if not KEY_ID.match(headers[KEY_ID_HEADER].decode("latin-1")):
            return Refusal("malformed_signature", "key id is not a key id", KEY_ID_HEADER)
        if not _HEX64.match(headers[CONTENT_SHA256_HEADER]):
            return Refusal(
                "malformed_signature", "content digest is not 64 hex digits", CONTENT_SHA256_HEADER
            )
        if not _HEX64.match(headers[SIGNATURE_HEADER]):
            return Refusal("malformed_signature", "signature is not 64 hex digits")
        ts_s = float(ts)
        skew_s = ts_s - now_s
        if abs(skew_s) > self.window_s:
            return Refusal(
                "stale_timestamp",
                f"timestamp {skew_s:+.1f} s from this server's clock (limit +-{self.window_s:g} s)",
                TIMESTAMP_HEADER,
            )
        if ts_s < self.started_at_s - self.start_skew_s:
            return Refusal(
                "signed_before_start",
                f"signed {self.started_at_s - ts_s:.1f} s before this process started (a call "
                "captured before a restart)",
                TIMESTAMP_HEADER,
            )
        return None

    def authenticate(
        self, method: bytes, target: bytes, headers: Mapping[str, bytes], now_s: float
    ) -> Verified | Refusal:
        """Everything but the body: on success the nonce is remembered (a replay of these headers
        is refused before its body is read) and the body must then pass ``verify_body``."""
        refusal = self.check_headers(headers, now_s)
        if refusal is not None:
            return refusal
        key_id = headers[KEY_ID_HEADER].decode("latin-1")
        key = self.keys.ring.key(key_id)
        if key is None:
            return Refusal("unknown_key", f"no key {key_id!r} in this keyring", KEY_ID_HEADER)
        ts, nonce, digest = (
            headers[TIMESTAMP_HEADER], headers[NONCE_HEADER], headers[CONTENT_SHA256_HEADER]
        )  # fmt: skip
        host = headers.get("host", b"")
        canonical = canonical_request(method, host, target, ts, nonce, key_id.encode(), digest)
        if not hmac.compare_digest(signature(key, canonical), headers[SIGNATURE_HEADER]):
            return Refusal("bad_signature", "signature does not match (wrong key or altered)")
        self._expire(now_s)
        ts_s = float(ts)
        if nonce in self._seen or ts_s <= self.floor_s:
            return Refusal("replayed", "nonce already used (a replayed request)", NONCE_HEADER)
        self._remember(ts_s, nonce)
        return Verified(key_id, key, nonce, digest)

    @staticmethod
    def verify_body(verified: Verified, body_sha256: bytes) -> Refusal | None:
        """None when the body read hashes (hex) to what the signed header said."""
        if hmac.compare_digest(verified.content_sha256, body_sha256):
            return None
        return Refusal(
            "body_mismatch", "the body does not match its signed digest (altered in transit)",
            CONTENT_SHA256_HEADER,
        )  # fmt: skip

    def verify(
        self,
        method: bytes,
        target: bytes,
        headers: Mapping[str, bytes],
        body: bytes,
        now_s: float,
    ) -> Refusal | None:
        """Both steps, for a caller that holds the whole body: None when authentic and fresh."""
        result = self.authenticate(method, target, headers, now_s)
        if isinstance(result, Refusal):
            return result
        return self.verify_body(result, hashlib.sha256(body).hexdigest().encode())

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
