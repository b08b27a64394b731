"""``ClusterDispatcher``: the gateway's ``Backend``. It carries out the policy's decisions on live
nodes: asks the KV manager for every site's cached prefix, calls the shared router, picks the decode
node, tells the decode node to expect the KV, tells the prefill node to compute it and stream it
there, and relays the decode node's tokens. A lost prefill (node killed, link cut, transfer aborted)
is retried once with local prefill on another node; a client that goes away aborts the request at
both nodes (the decode stream closes, the prefill is cancelled) so its KV is freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from prfaas.cache import GlobalKVManager
from prfaas.core import NodeRole, RequestId, RequestView, SiteId
from prfaas.policy import NoRouteError, Router, least_loaded
from prfaas.policy.decisions import RouteDecision
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.backend import GenerationError, GenerationRequest, ModelInfo, TokenEvent
from prfaas.serve.gateway.hashing import block_hashes, prompt_digest
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import (
    DecodeCommand,
    DecodeEvent,
    PrefillCommand,
    PrefillOutcome,
    PrefixPullCommand,
    SamplingMsg,
    pack_tokens,
)

MAX_ATTEMPTS = 2
"""Real failures (a lost node or transfer) a request survives: the first, retried locally."""
MAX_BUSY_SKIPS = 2
"""Refusals by nodes that are draining (changing role) skipped on top of that."""
ABORT_TIMEOUT_S = 2.0


class _Retryable(Exception):
    """The attempt failed before any token reached the client: try again elsewhere."""

    def __init__(
        self, reason: str, message: str, node: str | None = None, busy: str | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.node = node
        """A node that looks dead: out of rotation until it heartbeats again."""
        self.busy = busy
        """A node that refused (draining, changing role): skip it until its next report."""


@dataclass(frozen=True, slots=True)
class RouteRecord:
    """What happened to one request (for the demo's report and the sim comparison)."""

    request_id: str
    prefill_site: str
    prefill_node: str
    decode_node: str
    offloaded: bool
    num_prompt_tokens: int
    num_cached_tokens: int
    kv_bytes: int
    attempts: int
    moved_tokens: int = 0
    """Prefix tokens moved across sites before the prefill (the router's ``CacheMove``)."""
    prompt_digest: str = ""
    """Hash of the prompt's token ids: lets a load generator match records to its requests."""


class ClusterDispatcher:
    def __init__(
        self,
        registry: NodeRegistry,
        router: Router,
        fallback: Router,
        kv_manager: GlobalKVManager,
        metrics: GatewayMetrics,
        model: ModelInfo,
        block_tokens: int,
    ) -> None:
        self.registry = registry
        self.router = router
        self.fallback = fallback
        self.kv_manager = kv_manager
        self.metrics = metrics
        self._model = model
        self.block_tokens = block_tokens
        self.home = SiteId(registry.deployment.home_site.name)
        self.records: list[RouteRecord] = []
        self._moved: dict[str, int] = {}
        self._prefix_counts: dict[str, tuple[int, int]] = {}
        """Per site: (prompt tokens looked up, tokens found cached), since start."""
        self.control: Any = None
        """The gateway's ``ControlLoop``; observes every routed request's lengths."""
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))

    def model_info(self) -> ModelInfo:
        return self._model

    async def health(self) -> dict[str, object]:
        view = self.registry.view
        return {
            "nodes": sum(1 for n in view if n.healthy),
            "links": len(self.registry.link_states()),
        }

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- the Backend contract ---------------------------------------------------------------------
    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        hashes = block_hashes(req.prompt_token_ids, self.block_tokens)
        use_fallback = False
        failures = 0
        for attempt in range(1, MAX_ATTEMPTS + MAX_BUSY_SKIPS + 1):
            decision, decode_node = self._decide(req, hashes, use_fallback)
            started = False
            try:
                async for event in self._attempt(req, hashes, decision, decode_node, attempt):
                    started = True
                    yield event
                return
            except _Retryable as exc:
                if exc.node is not None:
                    self.registry.mark_unhealthy(exc.node)
                if exc.busy is not None:
                    self.registry.mark_draining(exc.busy)  # refused: try another node
                else:
                    failures += 1
                    use_fallback = True  # a lost (remote) prefill falls back to local prefill
                if started or failures == MAX_ATTEMPTS or attempt == MAX_ATTEMPTS + MAX_BUSY_SKIPS:
                    raise GenerationError(502, "server_error", f"request failed: {exc}") from None
                self.metrics.retries.labels(reason=exc.reason).inc()

    # -- one attempt ------------------------------------------------------------------------------
    def _decide(
        self, req: GenerationRequest, hashes: tuple[int, ...], use_fallback: bool
    ) -> tuple[RouteDecision, str]:
        n = len(req.prompt_token_ids)
        view = RequestView(
            RequestId(req.request_id),
            n,
            self.kv_manager.peek(hashes, n),
            hashes,
            req.max_tokens,
        )
        now = self.registry.modelled_s(time.monotonic())
        router = self.fallback if use_fallback else self.router
        try:
            decision = router.route(view, self.registry.view, now)
        except NoRouteError as exc:
            raise GenerationError(503, "service_unavailable", f"no prefill node: {exc}") from None
        decode = least_loaded(self.registry.view, self.home, NodeRole.DECODE)
        if decode is None:
            raise GenerationError(503, "service_unavailable", "no decode node available")
        # A bounded label set: the decision's own reason text names lengths.
        kind = "rerouted" if decision.rerouted else "cache_move" if decision.cache_move else "rule"
        self.metrics.route_decisions.labels(
            target="prfaas" if decision.offloaded else "local", reason=kind
        ).inc()
        if self.control is not None:
            self.control.observe(n - decision.num_cached_tokens, req.max_tokens)
        return decision, decode.node_id

    async def _attempt(
        self,
        req: GenerationRequest,
        hashes: tuple[int, ...],
        decision: RouteDecision,
        decode_node: str,
        attempt: int,
    ) -> AsyncIterator[TokenEvent]:
        reg = self.registry
        dec_ep = reg.endpoints[decode_node]
        sampling = SamplingMsg(
            max_new_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed or 0,
            stop_token_ids=list(req.stop_token_ids),
        )
        # Each attempt has its own id at the nodes: a retry must not collide with what is left of
        # the attempt it replaces (a decode node frees a closed stream asynchronously).
        attempt_id = f"{req.request_id}.{attempt}"
        decode_cmd = DecodeCommand(
            request_id=attempt_id,
            num_prompt_tokens=len(req.prompt_token_ids),
            sampling=sampling,
            timeout_s=reg.deployment.gateway.request_timeout_s,
        )
        prefill_cmd = PrefillCommand(
            request_id=attempt_id,
            tokens=pack_tokens(req.prompt_token_ids),
            block_hashes=list(hashes),
            use_cached_tokens=decision.num_cached_tokens,
            decode_node=decode_node,
            decode_host=dec_ep.host,
            decode_transfer_port=dec_ep.transfer_port,
            cross_site=decision.prefill_site != self.home,
            sampling=sampling,
        )
        decode_url = f"http://{dec_ep.host}:{dec_ep.http_port}/nodes/{decode_node}/decode"
        moved = await self._move_cache(decision, hashes)
        self._moved[req.request_id] = moved
        # The decode node's site may already store a prefix: then only the rest crosses.
        n = len(req.prompt_token_ids)
        home_tokens = self.kv_manager.peek(hashes, n).get(self.home, 0)
        decode_cmd = decode_cmd.model_copy(
            update={"block_hashes": list(hashes), "prefix_tokens": home_tokens}
        )
        uncached = len(req.prompt_token_ids) - decision.num_cached_tokens
        reg.track(decision.prefill_node, req.request_id, uncached)
        reg.track(decode_node, req.request_id, len(req.prompt_token_ids))
        try:
            async for event in self._exchange(
                req, decision, decode_node, decode_url, decode_cmd, prefill_cmd, hashes, attempt
            ):
                yield event
        finally:
            reg.untrack(decision.prefill_node, req.request_id)
            reg.untrack(decode_node, req.request_id)
            self._moved.pop(req.request_id, None)

    async def _move_cache(self, decision: RouteDecision, hashes: tuple[int, ...]) -> int:
        """Carry out the router's ``CacheMove``: the prefill site pulls the longer prefix from the
        site that holds it. Returns the tokens moved (0: none asked, or it failed and the prefill
        will simply compute more)."""
        move = decision.cache_move
        if move is None or move.num_tokens <= 0:
            return 0
        src = least_loaded(self.registry.view, move.src_site, NodeRole.PREFILL)
        if src is None:
            return 0
        src_ep = self.registry.endpoints[src.node_id]
        dst_ep = self.registry.endpoints[decision.prefill_node]
        num_blocks = move.num_tokens // self.block_tokens
        cmd = PrefixPullCommand(
            block_hashes=list(hashes[:num_blocks]),
            num_tokens=move.num_tokens,
            src_url=f"http://{src_ep.host}:{src_ep.http_port}",
        )
        try:
            r = await self._client.post(
                f"http://{dst_ep.host}:{dst_ep.http_port}/prefix/pull",
                json=cmd.model_dump(),
                timeout=cmd.timeout_s + 5.0,
            )
            ok = r.status_code == 200 and bool(r.json().get("ok"))
        except httpx.HTTPError:
            ok = False
        if not ok:
            self.metrics.retries.labels(reason="cache_move_failed").inc()
            return 0
        self.kv_manager.store(move.dst_site, hashes[:num_blocks], move.num_tokens)
        return move.num_tokens

    async def _exchange(
        self,
        req: GenerationRequest,
        decision: RouteDecision,
        decode_node: str,
        decode_url: str,
        decode_cmd: DecodeCommand,
        prefill_cmd: PrefillCommand,
        hashes: tuple[int, ...],
        attempt: int,
    ) -> AsyncIterator[TokenEvent]:
        pre_ep = self.registry.endpoints[decision.prefill_node]
        prefill_base = f"http://{pre_ep.host}:{pre_ep.http_port}/nodes/{decision.prefill_node}"
        try:
            async with self._client.stream(
                "POST", decode_url, json=decode_cmd.model_dump()
            ) as resp:
                if resp.status_code != 200:
                    raise _Retryable(
                        "decode_refused",
                        f"decode node {decode_node}: {resp.status_code}",
                        busy=decode_node,
                    )
                lines = resp.aiter_lines()
                ready = await _next_event(lines, decode_node)
                if ready.kind != "ready":
                    raise _Retryable("decode_failed", ready.error, decode_node)
                prefill_cmd = prefill_cmd.model_copy(
                    update={"receiver_cached_tokens": ready.prefix_tokens}
                )
                prefill = asyncio.create_task(
                    self._client.post(f"{prefill_base}/prefill", json=prefill_cmd.model_dump())
                )
                try:
                    async for event in self._relay(lines, prefill, decision, decode_node, hashes,
                                                   req, attempt):  # fmt: skip
                        yield event
                finally:
                    if not prefill.done():
                        prefill.cancel()
                        with contextlib.suppress(Exception):
                            await self._client.post(
                                f"{prefill_base}/abort/{prefill_cmd.request_id}",
                                timeout=ABORT_TIMEOUT_S,
                            )
                    with contextlib.suppress(BaseException):
                        await prefill
        except httpx.HTTPError as exc:
            raise _Retryable("decode_unreachable", f"decode node {decode_node}: {exc}",
                             decode_node) from None  # fmt: skip

    async def _relay(
        self,
        lines: AsyncIterator[str],
        prefill: asyncio.Task[httpx.Response],
        decision: RouteDecision,
        decode_node: str,
        hashes: tuple[int, ...],
        req: GenerationRequest,
        attempt: int,
    ) -> AsyncIterator[TokenEvent]:
        next_line: asyncio.Task[DecodeEvent] = asyncio.ensure_future(
            _next_event(lines, decode_node)
        )
        prefill_seen = False
        try:
            while True:
                waiting = {next_line} if prefill_seen else {next_line, prefill}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                # The prefill may also have finished while a token was being yielded.
                if not prefill_seen and prefill.done():
                    prefill_seen = True
                    self._on_prefill_done(prefill, decision, decode_node, hashes, req, attempt)
                if next_line not in done:
                    continue
                event = next_line.result()
                if event.kind == "error":
                    raise _Retryable("decode_error", event.error)
                yield TokenEvent(tuple(event.token_ids), event.finish_reason)
                if event.finish_reason is not None:
                    if not prefill_seen:  # the last token can beat the prefill's own answer
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(asyncio.shield(prefill), ABORT_TIMEOUT_S)
                        if prefill.done():
                            with contextlib.suppress(_Retryable):  # the client has its answer
                                self._on_prefill_done(
                                    prefill, decision, decode_node, hashes, req, attempt
                                )
                    return
                next_line = asyncio.ensure_future(_next_event(lines, decode_node))
        finally:
            if not next_line.done():
                next_line.cancel()

    def _on_prefill_done(
        self,
        task: asyncio.Task[httpx.Response],
        decision: RouteDecision,
        decode_node: str,
        hashes: tuple[int, ...],
        req: GenerationRequest,
        attempt: int,
    ) -> None:
        node = decision.prefill_node
        try:
            resp = task.result()
        except httpx.HTTPError as exc:
            raise _Retryable("prefill_lost", f"prefill node {node}: {exc}", node) from None
        if resp.status_code != 200:
            raise _Retryable(
                "prefill_refused", f"prefill node {node}: {resp.status_code}", busy=node
            )
        outcome = PrefillOutcome.model_validate_json(resp.content)
        self.registry.untrack(node, req.request_id)  # its prefill work is done
        if not outcome.ok:
            raise _Retryable("prefill_failed", f"prefill node {node}: {outcome.error}")
        n = len(req.prompt_token_ids)
        site = decision.prefill_site
        self.kv_manager.use(SiteId(site), hashes, n)
        self.kv_manager.store(SiteId(site), hashes, n)
        self.metrics.observe_prefix_lookup(site, n, outcome.num_cached_tokens)
        looked, hit = self._prefix_counts.get(site, (0, 0))
        looked, hit = looked + n, hit + outcome.num_cached_tokens
        self._prefix_counts[site] = (looked, hit)
        self.metrics.prefix_hit_rate.labels(site=site).set(hit / looked)
        kv_bytes = outcome.kv_bytes_sent * self.registry.byte_divisor
        if decision.offloaded:
            self.metrics.cross_site_bytes.labels(src_site=site, dst_site=self.home).inc(kv_bytes)
        self.records.append(
            RouteRecord(
                req.request_id, site, node, decode_node, decision.offloaded, n,
                outcome.num_cached_tokens, kv_bytes, attempt, self._moved.get(req.request_id, 0),
                prompt_digest(req.prompt_token_ids),
            )
        )  # fmt: skip


async def _next_event(lines: AsyncIterator[str], node: str) -> DecodeEvent:
    while True:
        try:
            line = await anext(lines)
        except StopAsyncIteration:
            raise _Retryable("decode_closed", f"decode node {node} closed the stream") from None
        if line.strip():
            try:
                return DecodeEvent.model_validate(json.loads(line))
            except ValueError as exc:
                raise _Retryable("decode_garbled", f"decode node {node}: {exc}") from None
