"""A prefill node's cross-site counters, as the gateway's link state reads them: a transfer counts
whole in ``egress_backlog_bytes`` from its first layer (as the simulator's link counts a flow), each
piece moves from there to ``egress_bytes`` as the sender accepts it, and whatever a failed
transfer never handed over leaves the backlog."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from prfaas.core import NodeRole
from prfaas.core.clock import VirtualClock
from prfaas.engine.timed import TimedConfig, TimedEngine
from prfaas.engine.waiting import VirtualWaiter
from prfaas.perf import cost_model_for
from prfaas.serve.node.messages import PrefillCommand, SamplingMsg, pack_tokens
from prfaas.serve.node.worker import Node
from prfaas.transfer import Manifest, TransferError


class _Session:
    """Records the node's counters as each piece is offered; fails after ``fail_after`` pieces."""

    def __init__(self, node: Node, fail_after: int | None) -> None:
        self.node, self.fail_after = node, fail_after
        self.seen: list[tuple[int, int, int]] = []  # (egress, backlog, piece bytes) at each send
        self.accepted = 0

    async def send(self, _layer: int, _offset: int, view: memoryview) -> None:
        r = self.node.report()
        self.seen.append((r.egress_bytes, r.egress_backlog_bytes, view.nbytes))
        if self.fail_after is not None and len(self.seen) > self.fail_after:
            raise TransferError("peer went away")
        self.accepted += view.nbytes

    async def finish(self, first_token: int | None = None) -> None:
        pass


class _Link:
    def __init__(self, node: Node, fail_after: int | None = None) -> None:
        self.last = _Session(node, fail_after)
        self.manifest_bytes = 0

    @asynccontextmanager
    async def session(self, manifest: Manifest) -> AsyncIterator[_Session]:
        self.manifest_bytes = manifest.num_bytes
        yield self.last


def _node() -> Node:
    engine = TimedEngine(
        cost_model_for("paper-1t", "h200"), VirtualWaiter(VirtualClock()),
        TimedConfig(byte_divisor=1000),
    )  # fmt: skip
    return Node("n", "s", NodeRole.PREFILL, engine, None)


def _cmd(rid: str, cross_site: bool = True) -> PrefillCommand:
    return PrefillCommand(
        request_id=rid, tokens=pack_tokens(range(3000)), decode_node="d",
        decode_host="127.0.0.1", decode_transfer_port=1, cross_site=cross_site,
        sampling=SamplingMsg(max_new_tokens=4),
    )  # fmt: skip


@pytest.mark.timeout(30)
async def test_a_transfer_counts_whole_then_moves_piece_by_piece_into_egress() -> None:
    node = _node()
    link = _Link(node)
    outcome = await node.prefill(_cmd("a"), link)
    assert outcome.ok
    total = link.manifest_bytes
    assert total > 0 and len(link.last.seen) > 1
    handed = 0
    for egress, backlog, piece in link.last.seen:
        assert egress == handed and backlog == total - handed  # whole from the first layer
        handed += piece
    assert handed == total == outcome.kv_bytes_sent
    after = node.report()
    assert after.egress_bytes == total and after.egress_backlog_bytes == 0


@pytest.mark.timeout(30)
async def test_a_failed_transfer_leaves_no_backlog_and_counts_what_it_handed_over() -> None:
    node = _node()
    link = _Link(node, fail_after=2)
    outcome = await node.prefill(_cmd("b"), link)
    assert not outcome.ok
    r = node.report()
    assert r.egress_backlog_bytes == 0 and r.egress_bytes == link.last.accepted > 0


@pytest.mark.timeout(30)
async def test_a_local_transfer_is_no_egress() -> None:
    node = _node()
    link = _Link(node)
    assert (await node.prefill(_cmd("c", cross_site=False), link)).ok
    assert all(e == 0 and b == 0 for e, b, _ in link.last.seen)
    assert node.report().egress_bytes == 0


@pytest.mark.timeout(30)
async def test_prefilled_tokens_and_busy_seconds_count_what_was_computed() -> None:
    """The speed counters beside them (``prefill_meter``): a prefill that completed adds its
    uncached tokens and its seconds; one whose transfer failed adds its seconds only."""
    node = _node()
    assert (await node.prefill(_cmd("d"), _Link(node))).ok
    done = node.report()
    assert done.prefilled_tokens == 3000 and done.prefill_busy_s > 0
    assert not (await node.prefill(_cmd("e"), _Link(node, fail_after=1))).ok
    failed = node.report()
    assert failed.prefilled_tokens == 3000 and failed.prefill_busy_s > done.prefill_busy_s
