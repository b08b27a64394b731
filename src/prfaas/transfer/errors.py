"""The exceptions ``prfaas.transfer`` raises, and the abort reason codes that travel on the wire.

Codec (sans-I/O) errors all derive from ``ProtocolError``: a fuzz test checks that arbitrary input
bytes never make the codec raise anything else. Engine errors derive from ``TransferError``.
Imports nothing from prfaas.
"""

from __future__ import annotations

import enum


class AbortCode(enum.IntEnum):
    """Why a session or connection was aborted (the ``code`` of an ABORT frame)."""

    REFUSED = 1
    """The receiver's consumer refused to allocate for the manifest (e.g. over its KV budget)."""
    CHECKSUM = 2
    """A frame's MAC did not match: its bytes or header were changed on the wire (or it was
    replayed, reordered or dropped), or a peer holds another key."""
    DIGEST = 3
    """All chunks arrived but the whole-session digest did not match."""
    PROTOCOL = 4
    """A malformed, out-of-order, duplicated, overlapping or unknown frame."""
    TIMEOUT = 5
    """A peer stalled: no progress within the configured time."""
    CANCELLED = 6
    """The local application cancelled the session."""
    AUTH = 7
    """The handshake failed (wrong or missing pre-shared key)."""
    TOO_LARGE = 8
    """A length exceeds a limit (frame, chunk, manifest, session bytes)."""
    SHUTDOWN = 9
    """The peer is closing; sessions in progress are dropped."""
    CONNECTION_LOST = 10
    """A connection carrying this session's bytes broke."""
    INTERNAL = 11
    """A bug or an unexpected local failure."""
    HANDED_BACK = 12
    """The sender got a spot notice and gave the prefill back to the pool, which has another
    node send the same session: the receiver frees this attempt and keeps expecting it (a peer
    older than this code reads it as ``INTERNAL``: an abort like any other)."""


class ProtocolError(Exception):
    """The byte stream violates the wire format or the connection state machine.

    After this, the connection is unusable. ``code`` says which ABORT code to report to the peer.
    """

    code: AbortCode = AbortCode.PROTOCOL


class FrameTooLarge(ProtocolError):
    """A length field exceeds its documented limit (detected before anything is allocated)."""

    code = AbortCode.TOO_LARGE


class IntegrityError(ProtocolError):
    """A frame after the handshake failed its MAC: someone on the path changed, replayed,
    reordered or dropped bytes (or the peer holds another key). The connection is unusable."""

    code = AbortCode.CHECKSUM


class AuthenticationFailed(ProtocolError):
    """The peer's HMAC proof does not match our pre-shared key (or it skipped the handshake)."""

    code = AbortCode.AUTH


class LocalProtocolError(Exception):
    """This side tried to send a frame its connection state does not allow (a bug in the caller).

    Deliberately not a ``ProtocolError``: those describe what the *peer* sent.
    """


class TransferError(Exception):
    """Base class of the engine's errors (connections, sessions)."""


class SessionAborted(TransferError):
    """A session ended without a verified delivery. ``code`` and ``reason`` say why; ``by_peer``
    says whether the other side aborted it."""

    def __init__(self, code: AbortCode, reason: str, *, by_peer: bool = False) -> None:
        self.code = code
        self.reason = reason
        self.by_peer = by_peer
        side = "peer" if by_peer else "local"
        super().__init__(f"session aborted ({code.name.lower()}, {side}): {reason}")


class Refused(TransferError):
    """Raised by a receiver's ``allocate`` callback to refuse a session; the reason is sent."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class ConnectError(TransferError):
    """Could not connect to or authenticate with a peer."""
