"""``TransferConfig``: every knob of the transfer engine, validated, in one frozen dataclass.

Pure: no I/O in construction (an ``ssl.SSLContext`` is built by the caller and only held here).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from prfaas.transfer import frames as F

DEFAULT_NUM_CONNECTIONS = 4
"""Chosen from bench/transfer.py (docs/transfer.md): 4 connections reach the shaped-link rate with
50 ms RTT under default socket buffers (1 connection is capped by tcp_wmem at ~0.45 of 1 Gbit/s) and
are as fast as 8 on loopback, where more connections only add scheduling overhead on 2 cores."""


@dataclass(frozen=True, slots=True)
class TransferConfig:
    psk: bytes
    """Pre-shared key for the HMAC handshake, and (with both nonces) the source of every
    connection's MAC keys (at least 16 bytes)."""
    num_connections: int = DEFAULT_NUM_CONNECTIONS
    """TCP connections a sender opens to one receiver; chunks are striped across them."""
    chunk_bytes: int = 1 << 20
    """``send`` splits a producer's range into chunks of at most this many bytes."""
    max_inflight_bytes_per_session: int = 64 << 20
    """Bytes of one session queued or sent but not yet acknowledged; ``send`` waits above it."""
    max_inflight_bytes_per_link: int = 256 << 20
    """The same bound for all sessions to one peer together."""
    rate_limit_bytes_per_s: float | None = None
    """Token-bucket pacing of the link's payload bytes (None: unpaced)."""
    timeout_s: float = 30.0
    """Longest any single wait may last without progress (connect, accept, space, complete)."""
    stall_timeout_s: float = 30.0
    """Receiver: a session with no chunk, OPEN or END for this long is aborted (TIMEOUT)."""
    handshake_timeout_s: float = 10.0
    """Receiver: a connection not authenticated this long after it was accepted is closed
    (counted in ``Receiver.num_handshake_failures``). The handshake is 1.5 round trips."""
    max_pending_handshakes: int = 256
    """Receiver: connections accepted but not yet authenticated; beyond it the oldest is closed
    (so unauthenticated peers hold at most this many x ~1 KiB of buffers). Peers that
    authenticated before keep a few more of their own (``pending_handshakes``)."""
    max_session_bytes: int = 64 << 30
    """Receiver: larger manifests are refused (TOO_LARGE) before ``allocate`` is called."""
    max_chunk_bytes: int = 16 << 20
    """Receiver: larger chunks are a protocol error (checked at the frame header)."""
    ack_every_bytes: int = 4 << 20
    """Receiver: acknowledge verified bytes at least this often ..."""
    ack_delay_s: float = 0.001
    """... or this long after the first unacknowledged byte (so small windows never stall)."""
    max_sessions_per_peer: int = 4096
    """Receiver: open sessions one sender may hold; beyond it OPEN is refused."""
    name: str = ""
    """This side's name, sent in HELLO (logs only)."""
    ssl_context: ssl.SSLContext | None = None
    """TLS around every connection (server context for a receiver, client context for a sender)."""
    server_hostname: str | None = None
    """Sender with TLS: the name to verify the receiver's certificate against."""

    def __post_init__(self) -> None:
        if len(self.psk) < 16:
            raise ValueError(f"psk must be at least 16 bytes, got {len(self.psk)}")
        if not 1 <= self.num_connections <= 64:
            raise ValueError(f"num_connections must be in 1..64, got {self.num_connections}")
        if not 4096 <= self.chunk_bytes <= F.MAX_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be in 4096..{F.MAX_CHUNK_BYTES}")
        if self.chunk_bytes > self.max_chunk_bytes:
            raise ValueError(f"chunk_bytes {self.chunk_bytes} > max_chunk_bytes")
        for name in ("max_inflight_bytes_per_session", "max_inflight_bytes_per_link"):
            if getattr(self, name) < self.chunk_bytes:
                raise ValueError(f"{name} must be >= chunk_bytes, got {getattr(self, name)}")
        if self.rate_limit_bytes_per_s is not None and self.rate_limit_bytes_per_s <= 0:
            raise ValueError(f"rate_limit_bytes_per_s must be > 0: {self.rate_limit_bytes_per_s}")
        if self.max_pending_handshakes < 1:
            raise ValueError(f"max_pending_handshakes must be >= 1: {self.max_pending_handshakes}")
        for name in ("timeout_s", "stall_timeout_s", "handshake_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if len(self.name.encode()) > F.MAX_NAME_BYTES:
            raise ValueError(f"name is longer than {F.MAX_NAME_BYTES} bytes: {self.name!r}")
