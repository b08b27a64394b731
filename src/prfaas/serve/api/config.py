"""``GatewayHTTPConfig``: the knobs of the gateway's HTTP surface (limits, deadlines, defaults).

A frozen dataclass, validated on construction; ``prfaas.config`` composes it with the rest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GatewayHTTPConfig:
    max_in_flight: int = 64
    """Requests generating at once (holding an admission slot)."""
    max_queued: int = 256
    """Requests waiting for a slot; one more is refused with 429 before the backend is touched."""
    queue_timeout_s: float = 10.0
    """Longest a request waits for a slot before it is refused with 429."""
    request_timeout_s: float = 300.0
    """Deadline from arrival to the last token; past it the request ends with 504 (or an error
    event if streaming had begun) and the backend is cancelled."""
    retry_after_s: int = 1
    """Value of the ``Retry-After`` header on 429 answers."""
    default_max_tokens: int = 256
    """``max_tokens`` when the client gives none (clipped to the context left)."""
    max_body_bytes: int = 16 * 2**20
    """Larger request bodies get 413."""
    relay_buffer_events: int = 64
    """Token events buffered between the backend and a slow client (bounded memory)."""
    api_keys: tuple[str, ...] = ()
    """When any is set, ``/v1/*``, ``/tokenize`` and ``/detokenize`` need ``Authorization:
    Bearer <one of them>`` (401 otherwise); ``/health``, ``/ready`` and ``/metrics`` stay open.
    Each at least ``MIN_API_KEY_CHARS`` printable ASCII characters, no spaces."""

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "retry_after_s", "default_max_tokens", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.relay_buffer_events < 1:
            raise ValueError(f"relay_buffer_events must be >= 1, got {self.relay_buffer_events}")
        if self.max_queued < 0:
            raise ValueError(f"max_queued must be >= 0, got {self.max_queued}")
        for name in ("queue_timeout_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 s, got {getattr(self, name)}")
        for i, key in enumerate(self.api_keys):
            # The message names the key's position, never the key.
            if not valid_api_key(key):
                raise ValueError(
                    f"api_keys[{i}] must be at least {MIN_API_KEY_CHARS} printable ASCII "
                    "characters without spaces"
                )


MIN_API_KEY_CHARS = 8


def valid_api_key(key: object) -> bool:
    return (
        isinstance(key, str)
        and len(key) >= MIN_API_KEY_CHARS
        and key.isascii()
        and key.isprintable()
        and " " not in key
    )
