"""Whose namespace a PrfaaS pool tenant's prefixes live in, what share of a pool node's prefix
store each tenant is guaranteed, and how big a timed node's store is (``docs/pool.md``,
*Prefixes*).

One implementation for the live pool (``pool_sections.PoolFileConfig.prefix_shares``, the node
process's ``serve/node/prefix_namespaces.PrefixNamespaces``, ``serve/node/engines``'
``prefix_store_bytes``) and the pool simulator (``sim/pool_sim.py``), which must agree: the
rules are here, the callers only hand in their inputs. The salts of the live namespaces (an HMAC
under the pool's internal key) are not: the store keys each namespace apart whatever the hashes,
and the simulator needs no secret to keep tenants apart. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SHARED = ""
"""The namespace of every tenant under ``share_prefixes: true`` (and a deployment's only one)."""

PREFIX_STORE_FRACTION = 0.1
"""A timed node process's prefix store: this fraction of one emulated instance's HBM."""


def prefix_shares(tenants: Sequence[tuple[str, float, float | None]]) -> dict[str, float]:
    """Tenant -> its guaranteed share of each pool node's prefix store, from ``(name, weight,
    prefix_share or None)`` per tenant: its ``prefix_share``, else its weight's part of what the
    tenants that set one leave."""
    told = sum(share for _, _, share in tenants if share is not None)
    weights = sum(weight for _, weight, share in tenants if share is None)
    return {
        name: share if share is not None else max(0.0, 1.0 - told) * weight / weights
        for name, weight, share in tenants
    }


def check_shares(shares: Mapping[str, float]) -> None:
    """Refuse shares outside [0, 1] or summing over the whole store."""
    bad = {t: s for t, s in shares.items() if not 0.0 <= s <= 1.0}
    if bad:
        raise ValueError(f"prefix shares must be in [0, 1], got {bad}")
    if sum(shares.values()) > 1.0 + 1e-9:
        raise ValueError(f"prefix shares sum to {sum(shares.values())} > 1")


def namespace_of(tenant: str, shared: bool) -> str:
    """The namespace ``tenant``'s prefixes live in (``SHARED`` under ``share_prefixes``)."""
    return SHARED if shared else tenant


def namespace_quotas(
    shares: Mapping[str, float], shared: bool, capacity_bytes: int
) -> dict[str, int]:
    """Namespace -> bytes guaranteed in a store of ``capacity_bytes`` (shared: the whole store to
    the one namespace)."""
    if shared:
        return {SHARED: capacity_bytes}
    return {t: int(capacity_bytes * s) for t, s in shares.items()}


def timed_store_bytes(instance_memory_bytes: float, byte_divisor: int = 1) -> int:
    """A timed node process's prefix store, in its payload bytes (``byte_divisor`` 1: modelled
    bytes, the simulator's unit)."""
    return int(instance_memory_bytes * PREFIX_STORE_FRACTION / byte_divisor)
