"""Cache-aware placement of a pool prefill on one of its group's free nodes (``docs/pool.md``,
*Prefixes* and *The fair-share rule*).

The admission (``pool_admission.PoolAdmission.dispatch``) decides *which* prefill a group starts
next (the fair-share rule); this module decides *where*, among the group's nodes that can take it
now: the node whose prefix store holds the longest prefix of the prompt in the tenant's own
namespace, ties broken by the caller's order (the driver's: node name, the rule before prefixes
counted). What the node holds comes from its reports (the driver's mirror of each node process's
store, ``pool/prefix_hits.py``); the admission then charges the prefill the compute that node
will actually do: the prompt less that hit.

``PlacementHints`` is what the front door is handed to know both: the live driver implements it
from its mirror of the nodes' reports, the pool simulator from its nodes' stores themselves
(``sim/pool_sim.py``); without hints every node is a miss and the charge is the submitted
compute. ``dispatch_cached`` is the one placement both call (``pool/frontdoor.py``
``FrontDoor.place`` and the simulator's dispatch), and ``settle_cached`` the one end: a done
prefill whose node really found another prefix than its placement expected (the live door's
mirror is a heartbeat behind; the simulator's hints are its stores, so never) is charged what it
really computed, a refund or a surcharge of the difference (``PoolAdmission.finish``). Pure: no
I/O, no clock, no asyncio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from prfaas.policy.pool_admission import EgressState, PoolAdmission, PrefillJob


@dataclass(frozen=True, slots=True)
class NodePick:
    """Where a prefill goes and the prompt tokens its node is expected to find there."""

    node: str
    cached_tokens: int = 0


class PlacementHints(Protocol):
    """What the caller knows of the nodes' prefix stores, asked per prefill chosen."""

    def hit_tokens(self, job: PrefillJob, node: str) -> int:
        """Prompt tokens of ``job`` that ``node``'s store holds in the tenant's namespace (a
        block-aligned prefix, shorter than the prompt); 0 when unknown."""
        ...

    def compute_s(self, job: PrefillJob, cached_tokens: int) -> float:
        """Node-seconds ``job`` takes on its group when its node finds ``cached_tokens`` of the
        prompt (what the node computes: the rest of the prompt)."""
        ...


def reusable_tokens(num_prompt_tokens: int, block_tokens: int) -> int:
    """The longest prefix a node may reuse: whole blocks, leaving at least one token to compute
    (the store's ``lookup`` limit)."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
    return max(0, (num_prompt_tokens - 1) // block_tokens) * block_tokens


def prefer_cached(nodes: Sequence[str], hit_of: Callable[[str], int]) -> NodePick:
    """The node of ``nodes`` (non-empty, the caller's order) with the longest expected hit; the
    first of them on a tie (no hit anywhere: the first node, the placement before prefixes)."""
    if not nodes:
        raise ValueError("no node to place on")
    best = NodePick(nodes[0], max(0, hit_of(nodes[0])))
    for node in nodes[1:]:
        hit = max(0, hit_of(node))
        if hit > best.cached_tokens:
            best = NodePick(node, hit)
    return best


@dataclass(frozen=True, slots=True)
class Placed:
    """A prefill the admission started, where it goes and what its start was charged."""

    job: PrefillJob
    pick: NodePick
    compute_s: float | None
    """Node-seconds its start was charged (None: the submitted ``job.compute_s``, no hints)."""


def dispatch_cached(
    admission: PoolAdmission,
    group: str,
    nodes: Sequence[str],
    now: float,
    egress: EgressState,
    hints: PlacementHints | None,
) -> Placed | None:
    """What one of ``group``'s free ``nodes`` (non-empty, the caller's order) starts now, or None:
    the admission picks the prefill (the fair-share rule); with ``hints`` it goes to the node
    holding the longest prefix of its prompt for its tenant (``prefer_cached``; ties: the first)
    and its start is charged what that node computes; without, the first node, charged as
    submitted."""
    picked: list[tuple[NodePick, float]] = []

    def compute_s_of(job: PrefillJob) -> float:
        assert hints is not None
        pick = prefer_cached(nodes, lambda n: hints.hit_tokens(job, n))
        picked.append((pick, hints.compute_s(job, pick.cached_tokens)))
        return picked[0][1]

    job = admission.dispatch(group, now, egress, None if hints is None else compute_s_of)
    if job is None:
        return None
    if not picked:
        return Placed(job, NodePick(nodes[0]), None)
    return Placed(job, picked[0][0], picked[0][1])


def settle_cached(
    admission: PoolAdmission,
    job: PrefillJob,
    now: float,
    placed: Placed,
    found_tokens: int | None,
    hints: PlacementHints | None,
) -> float:
    """End ``job``, placed as ``placed`` (``dispatch_cached``'s answer) with ``hints``:
    ``found_tokens`` is what its node really found of the prompt at a done outcome (None: it
    failed or was aborted: the charge stands, nothing to true up). Where its start was charged
    by the hints (``placed.compute_s``) and the node found other than expected, the admission
    trues the charge up to ``hints.compute_s(job, found_tokens)`` (the same price, at the real
    hit); found as expected, or charged as submitted (no hints: no price of a hit), it finishes
    as charged. Returns the correction (``PoolAdmission.finish``: negative, refunded; positive,
    surcharged)."""
    compute_s = None
    if (
        found_tokens is not None
        and hints is not None
        and placed.compute_s is not None
        and found_tokens != placed.pick.cached_tokens
    ):
        compute_s = hints.compute_s(job, found_tokens)
    return admission.finish(job, now, compute_s)
