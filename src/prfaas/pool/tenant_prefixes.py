"""What the pool holds for one tenant in its nodes' prefix stores (``docs/pool.md``, *Prefixes*;
the feedback's ``prefixes``, the operator's ``/internal/tenants`` and ``/metrics``).

Each pool node process's heartbeat carries its store per namespace
(``serve.node.messages.PrefixNamespaceMsg``: a tenant's name, or ``""`` for the one namespace
all tenants share under ``share_prefixes: true``; modelled bytes). ``combine`` sums one tenant's
namespace over the live processes of each group: a tenant reads only its own namespace (or the
shared one, marked so). No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prfaas.serve.node.messages import PrefixNamespaceMsg
from prfaas.serve.node.prefix_namespaces import SHARED


@dataclass(frozen=True, slots=True)
class GroupPrefixes:
    """One tenant's prefixes in one node group's stores, summed over its live processes."""

    group: str
    shared: bool
    """The namespace every tenant shares (``share_prefixes: true``): its figures are everyone's."""
    num_entries: int
    num_tokens: int
    """Prompt tokens the entries cover, summed (a prompt's checkpoints overlap)."""
    used_bytes: int
    """Modelled bytes held."""
    quota_bytes: int
    """Modelled bytes guaranteed (each process's quota, summed)."""
    hit_tokens: int
    """Prefix tokens its prefills found there (not computed again), since the processes started."""
    lookup_tokens: int
    """Prompt tokens its prefills looked up there."""
    num_processes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "shared": self.shared,
            "entries": self.num_entries,
            "tokens": self.num_tokens,
            "bytes": self.used_bytes,
            "quota_bytes": self.quota_bytes,
            "hit_tokens": self.hit_tokens,
            "lookup_tokens": self.lookup_tokens,
            "processes": self.num_processes,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GroupPrefixes:
        """A ``to_json`` row read back (the tenant's side of its feedback); a missing or
        malformed field raises (``KeyError``, ``TypeError``, ``ValueError``)."""
        return cls(
            group=str(raw["group"]),
            shared=bool(raw["shared"]),
            num_entries=int(raw["entries"]),
            num_tokens=int(raw["tokens"]),
            used_bytes=int(raw["bytes"]),
            quota_bytes=int(raw["quota_bytes"]),
            hit_tokens=int(raw["hit_tokens"]),
            lookup_tokens=int(raw["lookup_tokens"]),
            num_processes=int(raw["processes"]),
        )


def combine(
    tenant: str, reports: Iterable[tuple[str, Iterable[PrefixNamespaceMsg]]]
) -> tuple[GroupPrefixes, ...]:
    """``tenant``'s prefixes per group from (group, a live process's namespaces) pairs: its own
    namespace's figures, else the shared one's; by group name."""
    sums: dict[str, list[int]] = {}
    shared: dict[str, bool] = {}
    for group, namespaces in reports:
        mine = {n.namespace: n for n in namespaces if n.namespace in (tenant, SHARED)}
        found = mine[tenant] if tenant in mine else mine.get(SHARED)
        if found is None:
            continue
        s = sums.setdefault(group, [0] * 7)
        values = (found.num_entries, found.num_tokens, found.used_bytes, found.quota_bytes,
                  found.hit_tokens, found.lookup_tokens, 1)  # fmt: skip
        for i, v in enumerate(values):
            s[i] += v
        shared[group] = found.namespace == SHARED
    return tuple(GroupPrefixes(g, shared[g], *sums[g]) for g in sorted(sums))


def prefixes_json(found: Iterable[GroupPrefixes]) -> list[dict[str, Any]]:
    """The feedback's (and the operator's) ``prefixes``: one row per group (empty: no live
    process of a group has reported a namespace for the tenant yet)."""
    return [g.to_json() for g in found]
