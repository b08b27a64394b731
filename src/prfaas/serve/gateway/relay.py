"""One attempt's token relay (``Relay``), and how an attempt fails (``AttemptFailed``).

The dispatcher (``serve.gateway.dispatcher``) opens an attempt's decode stream and starts its
prefill; ``Relay`` then carries the decode node's events out to the client as ``TokenEvent``s
and books the prefill's outcome when it lands (before the first token, after it, or, rarely,
after the last one): the registry's tracking and successes, the ``OutcomeBook``'s route and
stored prefix, a stale mirror counted, and the request's lifecycle moved (TRANSFERRING,
DECODING, FINISHED). A failure at either node is raised as ``AttemptFailed``, whose stage and
kind the dispatcher reads to decide the node's rotation and whether to retry.

It makes no node calls of its own (it reads the stream and the task it is given) and must not
import the dispatcher, which imports it: what it needs of the dispatcher is ``RelayHost``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

from prometheus_client import Counter

from prfaas.core import RequestLifecycle, RequestState
from prfaas.policy.pool_tenant_route import POOL_NODE, POOL_SITE
from prfaas.serve.backend import GenerationRequest, TokenEvent
from prfaas.serve.gateway.attempt import AttemptPlan
from prfaas.serve.gateway.node_client import ABORT_TIMEOUT_S, NodeCallFailed
from prfaas.serve.gateway.outcomes import OutcomeBook
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import DecodeEvent, PrefillCommand, PrefillOutcome

log = logging.getLogger("prfaas.gateway")


class AttemptFailed(Exception):
    """One attempt failed; ``stage`` (prefill, decode) and ``kind`` (``NodeCallFailed`` kinds)
    decide what happens to the node and whether the request is tried again."""

    def __init__(self, stage: str, kind: str, node: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.kind = kind
        self.node = node

    @classmethod
    def of(cls, stage: str, exc: NodeCallFailed) -> AttemptFailed:
        return cls(stage, exc.kind, exc.node, str(exc))

    @property
    def reason(self) -> str:
        """A bounded metrics label, e.g. ``prefill_unreachable``."""
        return f"{self.stage}_{self.kind}"


class RelayHost(Protocol):
    """What a relay reads of its dispatcher (``ClusterDispatcher`` is one)."""

    @property
    def registry(self) -> NodeRegistry: ...

    @property
    def book(self) -> OutcomeBook: ...

    @property
    def prefix_mismatch(self) -> Counter: ...

    @property
    def block_tokens(self) -> int: ...


class Relay:
    """One attempt's token relay: decode events out, the prefill's outcome booked when it lands
    (it may land after the first tokens, or, rarely, after the last one)."""

    def __init__(
        self,
        dispatcher: RelayHost,
        req: GenerationRequest,
        hashes: tuple[int, ...],
        plan: AttemptPlan,
        prefill: asyncio.Task[PrefillOutcome],
        prefill_cmd: PrefillCommand,
        moved: int,
        life: RequestLifecycle,
    ) -> None:
        self.d = dispatcher
        self.req = req
        self.hashes = hashes
        self.plan = plan
        self.prefill = prefill
        self.prefill_request_id = prefill_cmd.request_id
        self.moved = moved
        self.life = life
        self.num_cached_tokens: int | None = None
        self.finished = False
        """The last token is out: the client's request is done, whatever the prefill says."""

    async def run(self, events: AsyncIterator[DecodeEvent]) -> AsyncGenerator[TokenEvent, None]:
        next_event: asyncio.Future[DecodeEvent] = asyncio.ensure_future(anext(events))
        try:
            while True:
                waiting: set[asyncio.Future[Any]] = {next_event}
                if not self.prefill_seen:
                    waiting.add(self.prefill)
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if not self.prefill_seen and self.prefill.done():
                    try:
                        self.book_prefill()  # raises when the prefill failed
                    except AttemptFailed as exc:
                        if self.life.state is not RequestState.DECODING:
                            raise
                        # A token came: the KV is whole at the decode node. An answer lost after
                        # it (a pool's front door gone, docs/pool.md) fails nothing still owed.
                        log.info("request %s: prefill answer lost after the first token: %s",
                                 self.req.request_id, exc)  # fmt: skip
                if not next_event.done():
                    continue
                try:
                    event = next_event.result()
                except NodeCallFailed as exc:
                    raise AttemptFailed.of("decode", exc) from None
                if event.kind == "error":
                    # The KV stream broke: when its prefill node says why (handed back on a
                    # notice, or gone), that is the failure to act on, not the decode node's.
                    await self._prefill_explains()
                    raise AttemptFailed("decode", "rejected", self.plan.decode_node, event.error)
                self._decoding()
                if event.finish_reason is not None:
                    await self._settle_prefill()
                    if event.kv_recomputed:  # the KV crossed but was not used
                        self.d.book.decode_recomputed(self.req.request_id, self.plan.decode_node)
                    self.finished = True
                    self.d.registry.record_success(self.plan.decode_node)
                    self.life.advance(RequestState.FINISHED, time.monotonic())
                    yield TokenEvent(
                        tuple(event.token_ids), event.finish_reason, self._cached_or_planned()
                    )
                    return
                yield TokenEvent(tuple(event.token_ids), None, self.num_cached_tokens)
                next_event = asyncio.ensure_future(anext(events))
        finally:
            if not next_event.done():
                next_event.cancel()
                with contextlib.suppress(BaseException):
                    await next_event

    def _decoding(self) -> None:
        """The first token: the KV is whole at the decode node (TTFT ends here)."""
        if self.life.state is not RequestState.DECODING:
            self.life.advance(RequestState.DECODING, time.monotonic())

    @property
    def prefill_seen(self) -> bool:
        return self.num_cached_tokens is not None

    async def _settle_prefill(self) -> None:
        """The last token can beat the prefill's own answer: give it a moment, then book it (the
        client has its answer either way, so a late failure is not raised)."""
        if self.prefill_seen:
            return
        # A failed answer is booked below as one (raised here it would fail a finished request).
        with contextlib.suppress(asyncio.TimeoutError, NodeCallFailed):
            await asyncio.wait_for(asyncio.shield(self.prefill), ABORT_TIMEOUT_S)
        if self.prefill.done():
            with contextlib.suppress(AttemptFailed):
                self.book_prefill()

    async def _prefill_explains(self) -> None:
        """A decode error while the prefill has not answered: give its answer a moment and
        raise its failure if it failed (a prefill handed back closes its KV stream as it
        answers, and the two race)."""
        if self.prefill_seen:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.prefill), ABORT_TIMEOUT_S)
        if not self.prefill.done():
            return
        try:
            outcome = self.prefill.result()
        except NodeCallFailed as exc:
            raise AttemptFailed.of("prefill", exc) from None
        if not outcome.ok:  # (a good one is not booked: this attempt fails all the same)
            self.book_prefill()  # raises its failure

    def _cached_or_planned(self) -> int:
        if self.num_cached_tokens is not None:
            return self.num_cached_tokens
        return self.plan.decision.num_cached_tokens

    def book_prefill(self) -> None:
        node = self.plan.decision.prefill_node
        self.num_cached_tokens = 0  # seen, whatever it says
        try:
            outcome = self.prefill.result()
        except NodeCallFailed as exc:
            raise AttemptFailed.of("prefill", exc) from None
        self.d.registry.untrack(node, self.req.request_id)  # its prefill work is done
        if not outcome.ok:
            kind = "handed_back" if outcome.handed_back else "rejected"
            raise AttemptFailed("prefill", kind, node, f"node {node}: {outcome.error}")
        self.num_cached_tokens = outcome.num_cached_tokens
        self.d.registry.record_success(node)
        if self.life.state is RequestState.PREFILLING:  # no token yet: the last KV is crossing
            self.life.advance(RequestState.TRANSFERRING, time.monotonic())
        decision = self.plan.decision
        move = decision.cache_move
        move_failed = move is not None and move.num_tokens > 0 and self.moved == 0
        # The mirror knows block-aligned prefixes only; an engine with its own, finer cache
        # (vLLM's 128-token blocks) may reuse more than that, which is no stale mirror.
        reused = outcome.num_cached_tokens // self.d.block_tokens * self.d.block_tokens
        # The gateway mirrors no store of a PrfaaS pool's: its front door places by the pool
        # nodes' prefixes, so what the ``pool`` node found is news, not a stale mirror.
        unmirrored = node == POOL_NODE and decision.prefill_site == POOL_SITE
        if reused != decision.num_cached_tokens and not move_failed and not unmirrored:
            # A failed cache move is counted as such; anything else is a stale mirror.
            self.d.prefix_mismatch.labels(side="prefill").inc()
        self.d.book.prefill_done(
            self.req.request_id, self.req.prompt_token_ids, self.hashes, decision,
            self.plan.decode_node, outcome, self.plan.number, self.moved,
            store_id=self.d.registry.process_of(node), now_s=time.monotonic(),
        )  # fmt: skip
