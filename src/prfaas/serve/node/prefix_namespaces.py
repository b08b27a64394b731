"""A PrfaaS pool node's prefix namespaces: whose chain a prompt's blocks hash to, and how much of
the node's prefix store each tenant is guaranteed (``docs/pool.md``, *Prefixes*).

The node computes a pool prefill's block-hash chain itself, from the prompt's own tokens and the
tenant the front door named (``PrefillCommand.tenant``; the command comes signed with the pool's
internal key): no caller's claimed hashes are used. Each tenant's chain is seeded
(``serve/gateway/hashing.py``'s ``seed``) with its salt, an HMAC of its name under a secret drawn
from the pool's internal key, which no tenant holds: a tenant cannot compute another's chain, and
equal prompts of two tenants share no key. With ``share_prefixes: true`` every tenant is in one
unsalted namespace, ``""``, which has the whole store.

Quotas are shares of the store (``PoolFileConfig.prefix_shares``: a tenant's ``prefix_share``, or
its weight's part of what the others leave), turned into bytes for a store of a given size; the
store applies them (``prefix_store.py``). The namespace and quota rules are
``cache/prefix_quotas.py``'s, which the pool simulator runs too; the salts are this module's. No
I/O: ``pool/node_main.py`` reads the pool file.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prfaas.cache.prefix_quotas import SHARED, check_shares, namespace_of, namespace_quotas
from prfaas.serve.gateway.hashing import block_hashes

__all__ = ["SHARED", "PrefixNamespaces"]
_SALT_LABEL = b"prfaas pool prefix namespace v1\0"


@dataclass(frozen=True, slots=True)
class PrefixNamespaces:
    secret: bytes = field(repr=False)
    """The pool-private secret tenants' salts are drawn from (never sent anywhere)."""
    shares: Mapping[str, float]
    """Tenant -> its guaranteed share of the store (0..1, summing to at most 1)."""
    shared: bool = False
    """``share_prefixes: true``: one unsalted namespace for every tenant."""

    def __post_init__(self) -> None:
        check_shares(self.shares)

    @classmethod
    def from_internal_key(
        cls, internal_key: str, shares: Mapping[str, float], shared: bool
    ) -> PrefixNamespaces:
        """Salts drawn from the pool's internal key (the front door and its nodes hold it): the
        same salts on every node of the pool, so the door could compute them too."""
        secret = hmac.digest(internal_key.encode(), b"prfaas prefix salts", "sha256")
        return cls(secret, dict(shares), shared)

    def namespace_of(self, tenant: str) -> str:
        return namespace_of(tenant, self.shared)

    def salt(self, tenant: str) -> bytes:
        """The seed of ``tenant``'s chains (empty when tenants share one namespace)."""
        if self.shared:
            return b""
        return hmac.digest(self.secret, _SALT_LABEL + tenant.encode(), "sha256")[:16]

    def chain(self, tenant: str, token_ids: Sequence[int], block_tokens: int) -> tuple[int, ...]:
        """The prompt's block hashes in ``tenant``'s namespace."""
        return block_hashes(token_ids, block_tokens, seed=self.salt(tenant))

    def quotas(self, capacity_bytes: int) -> dict[str, int]:
        """Namespace -> bytes guaranteed in a store of ``capacity_bytes`` (shared: the whole
        store to the one namespace)."""
        return namespace_quotas(self.shares, self.shared, capacity_bytes)
