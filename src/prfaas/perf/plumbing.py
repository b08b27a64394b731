"""``PlumbingCosts``: what the live system pays around the engine's forward passes.

The cost model's prefill and decode curves time the engine's work alone; a live request also pays
HTTP between client, gateway and nodes, KV session set-up and MACs, receiving, verifying and
installing KV bytes on the decode node, relaying each output token, and the gateway's own CPU.
Each term is measured (``prfaas profile``), stored in the profile file and charged by the
simulator to the process and core that pays it; the planner's capacity reads the same terms. A
term the profile did not measure is 0.0 and named in ``missing`` (the loader warns once).

Pure: no I/O, no clock; imports nothing from prfaas.
"""

from __future__ import annotations

from dataclasses import dataclass

PLUMBING_TERMS = (
    "node_per_request_s",
    "decode_per_kv_byte_s",
    "decode_per_output_token_s",
    "gateway_per_request_s",
    "gateway_per_output_token_s",
)


@dataclass(frozen=True, slots=True)
class PlumbingCosts:
    node_per_request_s: float = 0.0
    """Fixed CPU seconds a node process pays per request it serves (its HTTP call, session set-up,
    the first token's relay), on the core that node runs on."""
    decode_per_kv_byte_s: float = 0.0
    """Decode node CPU seconds per KV byte received, verified and installed."""
    decode_per_output_token_s: float = 0.0
    """Decode node CPU seconds per output token beyond the batched step (the token relay)."""
    gateway_per_request_s: float = 0.0
    """Gateway CPU seconds per request (HTTP in and out, tokenizing, routing)."""
    gateway_per_output_token_s: float = 0.0
    """Gateway CPU seconds per output token relayed to the client."""
    missing: tuple[str, ...] = PLUMBING_TERMS
    """The terms the profile did not measure (each 0.0 here)."""

    def __post_init__(self) -> None:
        for name in PLUMBING_TERMS:
            value = getattr(self, name)
            if not value >= 0.0:
                raise ValueError(f"plumbing cost {name} must be >= 0, got {value!r}")
        unknown = set(self.missing) - set(PLUMBING_TERMS)
        if unknown:
            raise ValueError(f"unknown plumbing terms in missing: {sorted(unknown)}")


NO_PLUMBING = PlumbingCosts()
"""Nothing measured: every term 0.0 (the model of today's simulator)."""
