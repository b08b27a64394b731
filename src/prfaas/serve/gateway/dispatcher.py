"""``ClusterDispatcher``: the gateway's ``Backend``. It carries out the policy's decisions on live
nodes: the ``AttemptPlanner`` decides an attempt (route, decode node, commands), the dispatcher
runs it through a ``NodeClient`` (tell the decode node to expect the KV, tell the prefill node to
compute it and stream it there, relay the decode node's tokens), and the ``OutcomeBook`` records
what the prefill left behind. Node I/O sits behind ``NodeClient``, so all of this runs against
in-memory nodes in unit tests. Relaying one attempt's tokens and booking its prefill's outcome
as it lands is ``serve.gateway.relay``'s (``Relay``, ``AttemptFailed``).

Prefix hits: the commands carry what the registry's ``KVMirror`` says the nodes' stores hold. The
decode node answers ``ready`` with the prefix it actually pinned; when that differs from what the
mirror said (its store evicted the prefix since its last report), the difference is counted
(``prfaas_prefix_mirror_mismatch_total{side="decode"}``) and the prefill is told what was pinned:
sending from the mirror's figure would hand the decode node KV rows it lacks or already holds.

Failures and rotation: a node that cannot be reached is quarantined by the registry until a
heartbeat after its quarantine; a node that answers 409 is skipped until its next report; a request
that failed at a node for its own reasons (an engine error, a refused transfer) is retried once with
local prefill elsewhere, and the node stays in rotation. A prefill a node *handed back* (a spot
notice: it would not end by the node's deadline) is no failure: it is routed again as new, on
another node (the noticed one is skipped), counted as
``retries_total{reason="prefill_handed_back"}``. A client that goes away aborts the request
at both nodes (the decode stream closes, the prefill is cancelled) so its KV is freed.

Request state: each request's ``core.RequestLifecycle`` moves through ``core.RequestState``'s one
table (QUEUED; ROUTED per attempt; PREFILLING once the decode node expects it and the prefill is
sent; TRANSFERRING when the prefill node answered before any token; DECODING from the first token;
FINISHED, FAILED or ABORTED). The table, not a flag, says whether a failed attempt may be retried:
it may from ROUTED, PREFILLING or TRANSFERRING, not once tokens have been streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
from prometheus_client import Counter

from prfaas.core import NodeRole, RequestLifecycle, RequestState, SiteId, can_transition
from prfaas.policy import Router, least_loaded
from prfaas.policy.waiting_room import WaitingRoom, WaitVerdict
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.backend import GenerationError, GenerationRequest, ModelInfo, TokenEvent
from prfaas.serve.control_tls import control_tls
from prfaas.serve.gateway.attempt import AttemptPlan, AttemptPlanner, NoPathError
from prfaas.serve.gateway.hashing import block_hashes
from prfaas.serve.gateway.node_client import HttpNodeClient, NodeCallFailed, NodeClient
from prfaas.serve.gateway.outcomes import OutcomeBook, RouteRecord
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.gateway.relay import AttemptFailed, Relay
from prfaas.serve.node.messages import (
    DecodeCommand,
    NodeEndpoint,
    PrefillCommand,
    PrefixPullCommand,
)

MAX_ATTEMPTS = 2
"""Real failures (a lost node or transfer) a request survives: the first, retried locally."""
MAX_BUSY_SKIPS = 2
"""Refusals by nodes that are draining (changing role) skipped on top of that."""
DEFAULT_ROUTE_LOG_SIZE = 10_000
LATE_ANSWER_TIMEOUT_S = 30.0
"""How long a prefill answer that comes after its request's last token is still awaited (to book
its route and outcome) before it is aborted at its node."""
log = logging.getLogger("prfaas.gateway")

__all__ = ["ClusterDispatcher", "RouteRecord"]


class ClusterDispatcher:
    def __init__(
        self,
        registry: NodeRegistry,
        router: Router,
        fallback: Router,
        metrics: GatewayMetrics,
        model: ModelInfo,
        block_tokens: int,
        *,
        node_client: NodeClient | None = None,
        node_auth: httpx.Auth | None = None,
        route_log_size: int = DEFAULT_ROUTE_LOG_SIZE,
        waiting_room: WaitingRoom | None = None,
    ) -> None:
        self.registry = registry
        self.waiting_room = waiting_room or WaitingRoom()
        """How long a request waits for a path (a restarting node) before its 503."""
        self.path_waits = Counter(
            "path_waits",
            "Requests that found no node in rotation and waited for one, by how the wait ended "
            "(served: a path came back; refused: 503 at the wait limit)",
            ["outcome"], namespace="prfaas", registry=metrics.registry,
        )  # fmt: skip
        self.kv = registry.kv
        self.metrics = metrics
        self.prefix_mismatch = Counter(
            "prefix_mirror_mismatch",
            "Requests whose node found another cached prefix than the gateway's mirror of its "
            "store said (decode: pinned at the decode node; prefill: reused by the prefill node)",
            ["side"], namespace="prfaas", registry=metrics.registry,
        )  # fmt: skip
        self._model = model
        self.block_tokens = block_tokens
        self.home = SiteId(registry.deployment.home_site.name)
        self.nodes: NodeClient = node_client or HttpNodeClient(
            node_auth, control_tls(registry.deployment)
        )
        self.planner = AttemptPlanner(registry, router, fallback, metrics)
        self.book = OutcomeBook(
            registry.kv, metrics, self.home, registry.byte_divisors, route_log_size
        )
        self.lifecycles: dict[str, RequestLifecycle] = {}
        """The requests being served, by id, and where each is."""
        self.ended: deque[RequestLifecycle] = deque(maxlen=route_log_size)
        """The last requests that ended (FINISHED, FAILED or ABORTED), oldest first."""
        self._late_answers: dict[asyncio.Task[None], tuple[Relay, NodeEndpoint]] = {}
        """Bookings of prefill answers that came after their request's last token."""

    @property
    def records(self) -> deque[RouteRecord]:
        return self.book.records

    @property
    def control(self) -> Any:
        """The gateway's ``ControlLoop``; observes every routed request's lengths."""
        return self.planner.control

    @control.setter
    def control(self, loop: Any) -> None:
        self.planner.control = loop

    def model_info(self) -> ModelInfo:
        return self._model

    async def health(self) -> dict[str, object]:
        view = self.registry.view
        return {
            "nodes": sum(1 for n in view if n.healthy),
            "nodes_in_rotation": sum(1 for n in view if n.accepting),
            "links": len(self.registry.link_states()),
        }

    async def ready(self) -> str | None:
        view = self.registry.view
        if not any(True for _ in view):
            return "no node has registered yet"
        if least_loaded(view, self.home, NodeRole.DECODE) is None:
            return f"no decode node of site {self.home} is in rotation"
        sites = self.registry.site_kinds()
        if all(least_loaded(view, site, NodeRole.PREFILL) is None for site in sites):
            return "no prefill node is in rotation"
        return None

    async def aclose(self) -> None:
        late = list(self._late_answers.items())
        for task, _ in late:
            task.cancel()
        await asyncio.gather(*(task for task, _ in late), return_exceptions=True)
        for _, (relay, ep) in late:  # a task cancelled before it ran did not give up itself
            await self._give_up_late(relay, ep)
        await self.nodes.aclose()

    def _late_answer(self, relay: Relay, ep: NodeEndpoint) -> None:
        """Wait (bounded) for a finished request's prefill answer and book it; abort it at its
        node if it does not come."""

        async def book() -> None:
            with contextlib.suppress(Exception):  # a failed answer is booked as one below
                await asyncio.wait_for(asyncio.shield(relay.prefill), LATE_ANSWER_TIMEOUT_S)
            if relay.prefill.done():
                with contextlib.suppress(AttemptFailed):
                    relay.book_prefill()
            else:
                await self._give_up_late(relay, ep)

        task = asyncio.create_task(book())
        self._late_answers[task] = (relay, ep)
        task.add_done_callback(self._late_answers.pop)

    async def _give_up_late(self, relay: Relay, ep: NodeEndpoint) -> None:
        if relay.prefill.done():
            return
        relay.prefill.cancel()
        with contextlib.suppress(BaseException):
            await relay.prefill
        request_id = relay.prefill_request_id
        await self.nodes.abort(ep, request_id)
        log.warning("request %s: no prefill answer within %.0f s of its last token",
                    request_id, LATE_ANSWER_TIMEOUT_S)  # fmt: skip

    def _state_left(self, state: RequestState, seconds: float) -> None:
        self.metrics.request_state_seconds.labels(state=state.value).observe(seconds)

    # -- the Backend contract ---------------------------------------------------------------------
    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        life = RequestLifecycle(req.request_id, time.monotonic(), self._state_left)
        self.lifecycles[req.request_id] = life
        try:
            async with contextlib.aclosing(self._generate(req, life)) as events:
                async for event in events:
                    yield event
        except GenerationError:
            if not life.is_terminal:  # no route, no decode node: failed before any attempt
                life.advance(RequestState.FAILED, time.monotonic())
            raise
        except (GeneratorExit, asyncio.CancelledError):
            if not life.is_terminal:  # the client went away
                life.advance(RequestState.ABORTED, time.monotonic())
            raise
        finally:
            self.lifecycles.pop(req.request_id, None)
            self.ended.append(life)

    async def _generate(
        self, req: GenerationRequest, life: RequestLifecycle
    ) -> AsyncGenerator[TokenEvent, None]:
        hashes = block_hashes(req.prompt_token_ids, self.block_tokens)
        use_fallback = False
        failures = 0
        failed_at: set[str] = set()
        last = MAX_ATTEMPTS + MAX_BUSY_SKIPS
        for number in range(1, last + 1):
            plan = await self._plan(req, hashes, number, use_fallback, frozenset(failed_at))
            life.advance(RequestState.ROUTED, time.monotonic())
            try:
                # aclosing: a client that leaves closes every nested generator at once, down to
                # the decode stream (left to the garbage collector, they would hold it open).
                attempt = self._attempt(req, hashes, plan, life)
                async with contextlib.aclosing(attempt) as events:
                    async for event in events:
                        yield event
                return
            except AttemptFailed as exc:
                self._on_failure(exc)
                # The retry avoids both ends where it can: a prefill that failed to reach the
                # decode node's KV port looks like a prefill failure but says the decode node is
                # gone (seen in the soak: the retry went back to a killed decode node).
                failed_at.update((exc.node, plan.decision.prefill_node, plan.decode_node))
                if exc.kind not in ("refused", "handed_back"):
                    failures += 1
                    use_fallback = True  # a lost (remote) prefill falls back to local prefill
                # Tokens already streamed (DECODING): the table allows no new attempt.
                retry_allowed = can_transition(life.state, RequestState.ROUTED)
                give_up = not retry_allowed or failures == MAX_ATTEMPTS or number == last
                log.warning(
                    "request %s attempt %d (prefill %s, decode %s) failed while %s: %s%s",
                    req.request_id, number, plan.decision.prefill_node, plan.decode_node,
                    life.state.value, exc, "" if give_up else "; retrying",
                )  # fmt: skip
                if give_up:
                    life.advance(RequestState.FAILED, time.monotonic())
                    raise GenerationError(502, "server_error", f"request failed: {exc}") from None
                self.metrics.retries.labels(reason=exc.reason).inc()

    async def _plan(
        self,
        req: GenerationRequest,
        hashes: tuple[int, ...],
        number: int,
        use_fallback: bool,
        avoid: frozenset[str],
    ) -> AttemptPlan:
        """Plan the attempt; while no node can take it (one restarting), wait as the waiting room
        says, then plan again or refuse with its reason."""
        waited = False
        since_s: float | None = None  # the wait is bounded per attempt, from its first miss
        while True:
            try:
                plan = self.planner.plan(req, hashes, number, use_fallback, avoid)
            except NoPathError as exc:
                missing = exc.missing
                role = exc.role
            else:
                if waited:
                    self.path_waits.labels(outcome="served").inc()
                return plan
            now_s = time.monotonic()
            since_s = now_s if since_s is None else since_s
            # A restart's return is not predicted and there is no other path: no alternative.
            decision = self.waiting_room.decide(arrived_s=since_s, now_s=now_s, missing=missing)
            if decision.verdict is not WaitVerdict.WAIT or decision.recheck_at_s is None:
                if waited:
                    self.path_waits.labels(outcome="refused").inc()
                why = self._why_out(role)
                message = f"{decision.reason}; {why}" if why else decision.reason
                raise GenerationError(503, "service_unavailable", message)
            if not waited:
                log.info("request %s: %s; waiting up to %g s for a path",
                         req.request_id, missing, self.waiting_room.max_wait_s)  # fmt: skip
            waited = True
            await asyncio.sleep(max(0.0, decision.recheck_at_s - now_s))

    def _why_out(self, role: NodeRole) -> str:
        """Why each node of ``role`` is out of rotation (the decode nodes: the home site's)."""
        view = self.registry.view
        sites = [self.home] if role is NodeRole.DECODE else list(view.site_ids())
        reasons = [
            f"{load.node_id}: {self.registry.rotation(load.node_id)[1] or 'busy'}"
            for site in sites
            for load in view.nodes(site, role)
        ]
        return ", ".join(reasons[:8]) if reasons else f"no {role.value} node registered"

    def _on_failure(self, exc: AttemptFailed) -> None:
        now_wall_s = time.monotonic()  # the registry's clock (heartbeats are stamped with it)
        if exc.kind == "unreachable":
            self.registry.mark_unreachable(exc.node, str(exc), now_wall_s)
        elif exc.kind in ("refused", "handed_back"):
            self.registry.mark_refused(exc.node, now_wall_s)
        # "rejected" / "closed": this request failed there; the node keeps serving.

    # -- one attempt ------------------------------------------------------------------------------
    async def _attempt(
        self,
        req: GenerationRequest,
        hashes: tuple[int, ...],
        plan: AttemptPlan,
        life: RequestLifecycle,
    ) -> AsyncGenerator[TokenEvent, None]:
        reg = self.registry
        moved = await self._move_cache(plan, hashes)
        decode_cmd, prefill_cmd = self.planner.commands(req, hashes, plan)
        decision = plan.decision
        uncached = len(req.prompt_token_ids) - decision.num_cached_tokens
        reg.track(decision.prefill_node, req.request_id, uncached)
        reg.track(plan.decode_node, req.request_id, len(req.prompt_token_ids))
        exchange = self._exchange(req, hashes, plan, decode_cmd, prefill_cmd, moved, life)
        try:
            async with contextlib.aclosing(exchange):
                async for event in exchange:
                    yield event
        finally:
            reg.untrack(decision.prefill_node, req.request_id)
            reg.untrack(plan.decode_node, req.request_id)

    async def _move_cache(self, plan: AttemptPlan, hashes: tuple[int, ...]) -> int:
        """Carry out the router's ``CacheMove``: the prefill site pulls the longer prefix from the
        site that holds it. Returns the tokens moved (0: none asked, or it failed and the prefill
        will simply compute more)."""
        move = plan.decision.cache_move
        if move is None or move.num_tokens <= 0:
            return 0
        src = least_loaded(self.registry.view, move.src_site, NodeRole.PREFILL)
        if src is None:
            return 0
        num_blocks = move.num_tokens // self.block_tokens
        cmd = PrefixPullCommand(
            block_hashes=list(hashes[:num_blocks]),
            num_tokens=move.num_tokens,
            src_url=self.nodes.base_url(self.registry.endpoints[src.node_id]),
        )
        dst = self.registry.endpoints[plan.decision.prefill_node]
        if not await self.nodes.pull_prefix(dst, cmd):
            self.metrics.retries.labels(reason="cache_move_failed").inc()
            return 0
        # The destination stored it before answering; its reports will say so (and whether it
        # stays), till then the planner must see it (the commands come next).
        store = self.registry.process_of(plan.decision.prefill_node)
        if store is not None and num_blocks:
            stored = [(hashes[num_blocks - 1], num_blocks * self.block_tokens)]
            self.kv.expect_stored(store, stored, time.monotonic())
        return move.num_tokens

    async def _exchange(
        self,
        req: GenerationRequest,
        hashes: tuple[int, ...],
        plan: AttemptPlan,
        decode_cmd: DecodeCommand,
        prefill_cmd: PrefillCommand,
        moved: int,
        life: RequestLifecycle,
    ) -> AsyncGenerator[TokenEvent, None]:
        dec_ep = self.registry.endpoints[plan.decode_node]
        pre_ep = self.registry.endpoints[plan.decision.prefill_node]
        try:
            async with self.nodes.decode(dec_ep, decode_cmd) as events:
                ready = await anext(events)
                if ready.kind != "ready":
                    raise AttemptFailed("decode", "rejected", plan.decode_node, ready.error)
                if ready.prefix_tokens != prefill_cmd.receiver_cached_tokens:
                    # The mirror was stale (an eviction since the store's last report): the KV
                    # that crosses must start where the decode node's pinned prefix ends.
                    self.prefix_mismatch.labels(side="decode").inc()
                    log.info(
                        "request %s: decode node %s pinned %d prefix tokens, its store's mirror "
                        "said %d", req.request_id, plan.decode_node, ready.prefix_tokens,
                        prefill_cmd.receiver_cached_tokens,
                    )  # fmt: skip
                    prefill_cmd = prefill_cmd.model_copy(
                        update={"receiver_cached_tokens": ready.prefix_tokens}
                    )
                prefill = asyncio.create_task(self.nodes.prefill(pre_ep, prefill_cmd))
                life.advance(RequestState.PREFILLING, time.monotonic())
                relay = Relay(self, req, hashes, plan, prefill, prefill_cmd, moved, life)
                try:
                    async with contextlib.aclosing(relay.run(events)) as relayed:
                        async for event in relayed:
                            yield event
                finally:
                    if not prefill.done() and relay.finished:
                        # The client has every token; the prefill node's answer is late (a busy
                        # host). Book it when it lands rather than drop its route and outcome.
                        self._late_answer(relay, pre_ep)
                    else:
                        if not prefill.done():
                            prefill.cancel()
                            await self.nodes.abort(pre_ep, prefill_cmd.request_id)
                        with contextlib.suppress(BaseException):
                            await prefill
        except NodeCallFailed as exc:
            raise AttemptFailed.of("decode", exc) from None
