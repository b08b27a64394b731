"""``Keyring``: the keys a process signs and verifies control-plane calls with (key id -> key).

A signed call names its key in a signed header (``x-prfaas-key-id``); the verifier looks the id up
here, so a process accepts several keys at once: the deployment key and, during a rotation, the
keys listed in the file's ``accept_psks``. Key ids are fingerprints by default
(``key_id_of``: not the key, and the same in every process that holds the key), or names given
by whoever builds the ring (per-tenant keys, next). A process signs with ``signing_id``.

``KeyringHolder`` is the one mutable seam: the verifier and the signing clients of a process read
the current ring from it on every call, and a reload (``serve.key_reload``: SIGHUP) swaps it whole.
No I/O here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
"""What a key id may look like (it travels in a header)."""
PLACEHOLDER_PSKS = frozenset(
    {"demo-key-not-a-secret-0123456789", "change-me-to-a-long-random-secret"}
)
"""The examples' public keys: anyone can sign with them. ``prfaas serve`` refuses them."""
LAUNCHED_BY_UP_ENV = "PRFAAS_LAUNCHED_BY_UP"
"""Set by ``prfaas up`` for its own children (it warned about a placeholder key already)."""


def placeholder_in(psk: str, accept_psks: Iterable[str] = ()) -> str | None:
    """The first of the keys that is a public placeholder, or None."""
    return next((k for k in (psk, *accept_psks) if k in PLACEHOLDER_PSKS), None)


def key_id_of(key: bytes) -> str:
    """A key's default id: a fingerprint that does not reveal the key."""
    return "k" + hashlib.sha256(b"prfaas key id\n" + key).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Keyring:
    """Key id -> key; ``signing_id`` names the key this process signs with."""

    keys: Mapping[str, bytes]
    signing_id: str
    _frozen: Mapping[str, bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a keyring needs at least one key")
        for key_id, key in self.keys.items():
            if not KEY_ID.match(key_id):
                raise ValueError(f"key id {key_id!r}: 1-64 of A-Z a-z 0-9 . _ -")
            if not key:
                raise ValueError(f"key {key_id!r} is empty")
        if self.signing_id not in self.keys:
            raise ValueError(f"signing_id {self.signing_id!r} is not in the keyring")
        object.__setattr__(self, "_frozen", MappingProxyType(dict(self.keys)))

    @classmethod
    def of(cls, psk: bytes, accepted: Iterable[bytes] = ()) -> Keyring:
        """Sign with ``psk``; accept it and every key in ``accepted`` (ids: fingerprints)."""
        keys = {key_id_of(k): k for k in accepted if k}
        keys[key_id_of(psk)] = psk
        return cls(keys, key_id_of(psk))

    def key(self, key_id: str) -> bytes | None:
        return self._frozen.get(key_id)

    @property
    def signing_key(self) -> bytes:
        return self._frozen[self.signing_id]

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._frozen))


class KeyringHolder:
    """The current keyring of a process; ``replace`` swaps it (a reload), readers see the new one
    on their next call. Calls already verified keep the key they were verified with."""

    def __init__(self, ring: Keyring) -> None:
        self._ring = ring
        self.num_reloads = 0

    @property
    def ring(self) -> Keyring:
        return self._ring

    def replace(self, ring: Keyring) -> None:
        self._ring = ring
        self.num_reloads += 1


KeySource = KeyringHolder | Keyring | bytes
"""What the signing and verifying halves accept: a holder (reloadable), a ring, or one psk."""


def holder_of(keys: KeySource) -> KeyringHolder:
    if isinstance(keys, KeyringHolder):
        return keys
    if isinstance(keys, Keyring):
        return KeyringHolder(keys)
    if not keys:
        raise ValueError("no key: the deployment's psk is empty")
    return KeyringHolder(Keyring.of(keys))


def ring_of_psks(psk: str, accept_psks: Iterable[str] = ()) -> Keyring:
    """The deployment file's keys as a ring (``psk`` signs; it and ``accept_psks`` verify)."""
    return Keyring.of(psk.encode(), [k.encode() for k in accept_psks])


def describe(ring: Keyring) -> str:
    """For logs: ids only, never keys."""
    return f"signing with {ring.signing_id}, accepting {', '.join(ring.key_ids)}"
