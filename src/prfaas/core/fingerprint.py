"""A model fingerprint's fields and the rule that compares two (``docs/pool.md``, "Fingerprints").

A fingerprint says which model a cache belongs to: ``config`` (the served model's name),
``weights_digest``, ``dtype``, ``block_tokens`` and ``cache_layout``. Two places compare one with
another: the pool's front door compares a tenant's submit with its group's, and a KV receiver
compares an incoming manifest's with its own model's (``serve.node.host``), so that KV computed
by other weights never lands in a decode node's cache. Both name the first field that differs.
Reading a model folder to make one is ``engine.fingerprint``'s. Pure: stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

FINGERPRINT_FIELDS = ("config", "weights_digest", "dtype", "block_tokens", "cache_layout")

Fingerprint = tuple[tuple[str, str], ...]
"""A fingerprint as it travels (a submit's JSON, a KV manifest): its fields, sorted by name."""


def as_fingerprint(fields: Mapping[str, str] | Iterable[tuple[str, str]]) -> Fingerprint:
    items = fields.items() if isinstance(fields, Mapping) else fields
    return tuple(sorted((str(k), str(v)) for k, v in items))


def first_difference(
    expected: Mapping[str, str], given: Mapping[str, str]
) -> tuple[str, str | None, str] | None:
    """The first field of ``expected`` that ``given`` does not match, as (field, given value,
    expected value); None when every field ``expected`` states is matched. A field ``expected``
    does not state is not compared (an emulated model has no weights to digest)."""
    for name in FINGERPRINT_FIELDS:
        if name in expected and given.get(name) != expected[name]:
            return name, given.get(name), expected[name]
    return None
