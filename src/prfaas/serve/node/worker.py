"""``Node``: one serving instance (prefill or decode role) around one engine.

Prefill: runs the engine's layer-wise prefill and streams each layer into a transfer session to the
decode node the gateway chose, as soon as the layer is handed out; the first token rides on the
session's END. Decode: reserves buffers for an expected request when its KV session opens
(``allocate``, which may refuse: over the KV budget), installs the verified session, and streams the
tokens of the running batch (continuous batching is the engine's). A node can change role after it
has drained (the rebalancer's decision). All waits are bounded.

Failures stay with their request: whatever the engine or the transfer raises, a prefill returns
``PrefillOutcome(ok=False, error=...)`` and a decode stream ends with ``DecodeEvent(kind="error")``
(never an HTTP 500); other requests go on. If the engine cannot serve any more (its thread died),
``report().fault`` says why and every request waiting on it fails with that reason. One abort is
no failure: a KV session its sender aborts ``HANDED_BACK`` (a pool node's spot notice, with a
command that said another node will send the same session) frees that attempt's buffers and the
decode node keeps expecting the request; a prefill node sends that code only for such a command.

Which bytes of a layer cross to the receiver is ``serve.node.kv_pieces``'s; the translations
between wire messages and the engine's types (sampling, token events) are
``serve.node.engine_messages``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from prfaas.core import NodeRole
from prfaas.engine import (
    Allocation,
    CachedPrefix,
    Engine,
    EngineError,
    LayerOutput,
    PrefillRequest,
    PrefillResult,
    SamplingParams,
    TokenEvent,
)
from prfaas.serve.node.engine_messages import decode_event_of, sampling_from
from prfaas.serve.node.kv_pieces import pieces_for_receiver
from prfaas.serve.node.messages import (
    DecodeCommand,
    DecodeEvent,
    NodeReport,
    PrefillCommand,
    PrefillOutcome,
    unpack_tokens,
)
from prfaas.serve.node.notice import NoticeDesk
from prfaas.serve.node.prefill_meter import PrefillMeter
from prfaas.serve.node.prefix_store import PrefixStore
from prfaas.transfer import (
    AbortCode,
    Manifest,
    OutboundSession,
    Refused,
    SessionAborted,
    TransferError,
)
from prfaas.transfer import Link as TransferLink

log = logging.getLogger(__name__)
STEP_FAILURE_BACKOFF_S = 0.05
"""After a decode step fails as a whole, wait this long before the next (never a hot loop)."""


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class _Expected:
    """A request this decode node was told to expect."""

    command: DecodeCommand
    sampling: SamplingParams
    prompt_token_ids: tuple[int, ...] = ()
    events: asyncio.Queue[DecodeEvent] = field(default_factory=asyncio.Queue)
    allocation: Allocation | None = None
    installed: bool = False
    prefix: CachedPrefix | None = None
    """The stored prefix this request's transfer extends (pinned: eviction cannot drop it)."""


class Node:
    def __init__(
        self,
        name: str,
        site: str,
        role: NodeRole | str,
        engine: Engine,
        prefix_store: PrefixStore | None,
        fixed_role: bool = False,
    ) -> None:
        self.name = name
        self.site = site
        self.role = NodeRole(role)
        """Changed only by a role switch after draining; the wire spells it ``role.value``."""
        self.engine = engine
        self.prefix_store = prefix_store
        self.fixed_role = fixed_role
        self.draining = False
        self.notice: NoticeDesk | None = None
        """The process's spot-notice desk (a worker host's prefill nodes): told of each prefill."""
        self.fingerprint: tuple[tuple[str, str], ...] = ()
        """What its KV manifests say of its model (``core.fingerprint``; set by its host): the
        receiver refuses KV of another model, naming the field."""
        self._expected: dict[str, _Expected] = {}
        self._wake = asyncio.Event()
        self._prefill_queue: dict[str, int] = {}
        self.egress_bytes = 0
        """Cross-site KV bytes handed to the sender so far, credited piece by piece as each is
        accepted (the gateway's link goodput is this less the links' unacknowledged bytes)."""
        self._num_prefilling = 0
        self.meter = PrefillMeter()
        """Uncached tokens prefilled and seconds spent computing them (the node's speed)."""
        self.num_decode_steps = 0
        """Decode steps that produced tokens so far (``prfaas profile``'s plumbing measurement
        divides the decode node's CPU between steps and tokens with it)."""
        self._unsent_kv_bytes = 0
        """KV bytes of this node's open cross-site sessions not yet accepted by the sender: a
        session counts its whole manifest when it opens, as the simulator's link counts a whole
        transfer when it starts, so the gateway's backlog (this plus the links' unacknowledged
        bytes) is the same quantity as the simulator's while a transfer crosses."""

    # -- load ------------------------------------------------------------------------------------
    def report(self) -> NodeReport:
        budget = self.engine.budget
        return NodeReport(
            node=self.name,
            site=self.site,
            role=self.role.value,
            queue_depth=len(self._prefill_queue)
            if self.role is NodeRole.PREFILL
            else sum(1 for e in self._expected.values() if not e.installed),
            queued_tokens=sum(self._prefill_queue.values()),
            batch_size=self.engine.num_running,
            kv_used_bytes=budget.used_bytes,
            kv_capacity_bytes=budget.budget_bytes,
            draining=self.draining,
            egress_bytes=self.egress_bytes,
            egress_backlog_bytes=self._unsent_kv_bytes,
            fault=self.fault,
            decode_steps=self.num_decode_steps,
            prefilled_tokens=self.meter.prefilled_tokens,
            prefill_busy_s=self.meter.busy_s(time.monotonic()),
            engine_cpu_s=self.engine.engine_cpu_s,
            forward_cpu_s=self.engine.forward_cpu_s,
        )

    @property
    def fault(self) -> str:
        """Why this node cannot serve ("" when it can): its engine stopped."""
        return self.engine.fault

    def close(self) -> None:
        """Stop the engine (joins its thread); requests still pending there fail."""
        self.engine.close()

    @property
    def idle(self) -> bool:
        """Nothing queued, computing, streaming or decoding here: safe to change role."""
        return (
            not self._prefill_queue
            and self._num_prefilling == 0
            and not self._expected
            and self.engine.num_running == 0
        )

    # -- prefill ---------------------------------------------------------------------------------
    async def prefill(
        self,
        cmd: PrefillCommand,
        link: TransferLink,
        namespace: str = "",
        on_computed: Callable[[], None] | None = None,
    ) -> PrefillOutcome:
        """Prefill and stream ``cmd``'s KV; any failure (engine, transfer, bad parameters) is
        this request's alone and comes back as ``ok=False`` with the reason. ``namespace``: the
        prefix store's namespace its prefix is looked up and stored in (a pool tenant's).
        ``on_computed``: called once the engine is done with it and its last layer is handed to
        the link, before the wait for the receiver's verification (a pool's front door frees the
        node then); not called when it fails before that."""
        rid = cmd.request_id
        self._num_prefilling += 1
        ok = False
        try:
            outcome = await self._prefill(cmd, link, namespace, on_computed)
            ok = outcome.ok
            return outcome
        except Exception as exc:
            if not isinstance(exc, (TransferError, EngineError, OSError, ValueError)):
                log.warning("node %s: prefill of %s failed", self.name, rid, exc_info=True)
            return PrefillOutcome(request_id=rid, ok=False, error=_reason(exc))
        finally:
            self._prefill_queue.pop(rid, None)
            self._num_prefilling -= 1
            if self.notice is not None:
                self.notice.ended(rid, ok, time.monotonic())

    async def _prefill(
        self,
        cmd: PrefillCommand,
        link: TransferLink,
        namespace: str,
        on_computed: Callable[[], None] | None,
    ) -> PrefillOutcome:
        rid = cmd.request_id
        token_ids = unpack_tokens(cmd.tokens)
        # A vLLM decode server runs the last prompt token itself, and a state cannot be rewound:
        # for a model with fixed-size states it installs all but that token. Send those (the
        # states before it) and no first token; a dense model's cache crosses whole.
        cut = (
            cmd.decode_recomputes_last_token
            and len(token_ids) > 1
            and any(not la.kind.grows_with_length for la in self.engine.cache_spec.layers)
        )
        if cut:
            token_ids = token_ids[:-1]
        n = len(token_ids)
        sampling = sampling_from(cmd.sampling)
        cached = None
        if self.prefix_store is not None and cmd.use_cached_tokens > 0:
            # (cut by one above, the prompt must still leave a token to compute)
            cached = self.prefix_store.lookup(
                cmd.block_hashes, n, min(cmd.use_cached_tokens, n - 1), namespace
            )
        k = 0 if cached is None else cached.num_tokens
        t0 = time.monotonic()
        # Checkpoint at every block; the store keeps what the KV manager's cache model keeps
        # (every ``checkpoint_every_blocks`` blocks and the last full block).
        store = self.prefix_store
        block = store.block_tokens if store is not None else None
        req = PrefillRequest(
            rid,
            token_ids,
            sampling,
            cached=cached,
            checkpoint_block_tokens=block if cmd.store_prefix and cmd.block_hashes else None,
        )
        # The receiver holds ``receiver_cached_tokens`` of the prefix (its site's store); all the
        # rest crosses, including what this node reused from its own store.
        receiver_tokens = min(cmd.receiver_cached_tokens, n - 1)
        full = self.engine.layout(n, receiver_tokens)
        manifest = Manifest.from_layout(rid, full, self.fingerprint)
        result: PrefillResult | None = None
        sent = 0
        unsent = 0  # this session's share of ``_unsent_kv_bytes``
        self._prefill_queue[rid] = n - k
        if self.notice is not None:
            self.notice.arrived(rid, n - k, manifest.num_bytes, time.monotonic())
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self._settle_unsent, lambda: unsent)
            # The session opens with the first layer, not while the prefill waits for the engine:
            # the receiver aborts a session without progress for its stall timeout (30 s), and a
            # queued prefill is not a stalled sender (the fidelity bench lost requests that way).
            session: OutboundSession | None = None
            computing = False
            try:
                async for out in self.engine.prefill_stream(req):
                    if isinstance(out, LayerOutput):
                        self._prefill_queue.pop(rid, None)  # computing now, no longer queued
                        if not computing:
                            computing = True
                            self.meter.started(time.monotonic())
                        if session is None and self.notice is not None:
                            self.notice.started(rid, time.monotonic())
                        if session is None:
                            session = await self._open(stack, link, manifest, cmd)
                            if cmd.cross_site:
                                unsent = manifest.num_bytes
                                self._unsent_kv_bytes += unsent
                        target = full.segments[out.position]
                        for offset, view in pieces_for_receiver(
                            out, cached, target, receiver_tokens
                        ):
                            await session.send(out.position, offset, view)
                            sent += view.nbytes
                            if cmd.cross_site:  # accepted by the sender: now the link's to count
                                self.egress_bytes += view.nbytes
                                taken = min(unsent, view.nbytes)
                                unsent -= taken
                                self._unsent_kv_bytes -= taken
                    else:
                        result = out
            finally:
                if computing:
                    self.meter.ended(time.monotonic(), n - k if result is not None else 0)
            if result is None:
                raise EngineError(f"request {rid}: the prefill ended without a result")
            if session is None:  # nothing to hand out (cannot happen with a layer per position)
                session = await self._open(stack, link, manifest, cmd)
            first_token = -1 if cut else result.first_token  # -1: the wire's "none"
            if on_computed is not None:
                # Computed and every byte queued on the link: what is left is the link's and the
                # receiver's (END, verification), not this node's compute.
                on_computed()
            await session.finish(first_token)
        stored: list[tuple[int, int]] = []
        if store is not None and result.checkpoints:
            try:  # an optimisation: the request itself succeeded, whatever happens here
                stored = store.insert(cmd.block_hashes, result.checkpoints, namespace)
            except Exception:
                log.warning("node %s: storing %s's prefix failed", self.name, rid, exc_info=True)
        return PrefillOutcome(
            request_id=rid,
            ok=True,
            first_token=first_token,
            num_cached_tokens=k,
            kv_bytes_sent=sent,
            prefill_s=time.monotonic() - t0,
            # What the gateway may count on before this process's next heartbeat says so.
            stored_prefixes=stored,
            store_epoch=store.epoch if store is not None else 0,
            store_seq=store.seq if store is not None else 0,
        )

    async def _open(
        self,
        stack: contextlib.AsyncExitStack,
        link: TransferLink,
        manifest: Manifest,
        cmd: PrefillCommand,
    ) -> OutboundSession:
        """Open the prefill's KV session on ``stack``. When the prefill is then cancelled because
        a spot notice handed it back and another node will send the same session
        (``cmd.keep_session_on_hand_back``: a pool re-queues it), the session is aborted with
        ``HANDED_BACK`` (before its own exit would cancel it), so the receiver keeps expecting
        it; otherwise the session's own exit cancels it as before."""
        session = await stack.enter_async_context(link.session(manifest))
        rid = cmd.request_id

        async def hand_back_exit(et: object, _e: object, _tb: object) -> bool:
            desk = self.notice
            if et is asyncio.CancelledError and desk is not None and desk.was_handed_back(rid):
                why = f"{self.name} got a spot notice and handed the prefill back"
                await asyncio.shield(session.abort(why, AbortCode.HANDED_BACK))
            return False

        if cmd.keep_session_on_hand_back:
            stack.push_async_exit(hand_back_exit)  # runs before the session's exit (LIFO)
        return session

    def _settle_unsent(self, unsent: Callable[[], int]) -> None:
        """A session closed (sent, failed or cancelled): what it never handed over leaves."""
        self._unsent_kv_bytes -= unsent()

    # -- decode ----------------------------------------------------------------------------------
    def expects(self, request_id: str) -> bool:
        return request_id in self._expected

    def allocate(self, manifest: Manifest) -> Sequence[memoryview]:
        """The transfer receiver's allocator for a session addressed to this node."""
        exp = self._expected.get(manifest.request_id)
        if exp is None:
            raise Refused(f"decode node {self.name} does not expect {manifest.request_id}")
        try:
            exp.allocation = self.engine.allocate(manifest, exp.sampling.max_new_tokens)
        except Exception as exc:  # over budget, mismatch, a dead engine: the sender is told why
            raise Refused(f"decode node {self.name}: {_reason(exc)}") from None
        return exp.allocation.layer_buffers

    def on_delivered(self, request_id: str, first_token: int) -> None:
        exp = self._expected.get(request_id)
        if exp is None or exp.allocation is None:
            return
        prefix = exp.prefix if exp.allocation.layout.num_cached_tokens > 0 else None
        try:
            event = self.engine.install(
                exp.allocation, first_token, exp.sampling, prefix, exp.prompt_token_ids
            )
        except Exception as exc:  # a cache that does not fit, a dead engine: nothing installed
            self.engine.release(request_id)
            exp.events.put_nowait(DecodeEvent(kind="error", error=f"install: {_reason(exc)}"))
            return
        exp.installed = True
        self._publish(event)
        self._wake.set()

    def on_transfer_failed(self, request_id: str, error: SessionAborted) -> None:
        exp = self._expected.get(request_id)
        if exp is None:
            return
        if error.by_peer and error.code is AbortCode.HANDED_BACK and not exp.installed:
            # A pool node got a spot notice and gave the prefill back; the pool has another
            # node send this same session. Free this attempt's buffers (the next one allocates
            # afresh) and keep waiting: the stream's own deadline still bounds the wait.
            if exp.allocation is not None:
                self.engine.release(request_id)
                exp.allocation = None
            log.info("node %s: %s's KV sender handed it back; expecting another", self.name,
                     request_id)  # fmt: skip
            return
        exp.events.put_nowait(DecodeEvent(kind="error", error=f"KV transfer: {error}"))

    def _publish(self, event: TokenEvent) -> None:
        exp = self._expected.get(event.request_id)
        if exp is None:
            return
        message = decode_event_of(event)
        if message is not None:
            exp.events.put_nowait(message)

    async def decode_loop(self) -> None:
        """Steps the running batch while there is one; sleeps until a request joins. A step that
        fails as a whole (a dead engine) fails every running request with its reason; the loop
        itself never stops before it is cancelled."""
        while True:
            if self.engine.num_running == 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                events = await self.engine.step_async()
            except Exception as exc:
                self._fail_waiting(f"decode step: {_reason(exc)}")
                await asyncio.sleep(STEP_FAILURE_BACKOFF_S)
                continue
            if events:
                self.num_decode_steps += 1
            for event in events:
                self._publish(event)

    def _fail_waiting(self, reason: str) -> None:
        """Fail the running requests; with a faulty engine also those whose KV has yet to come
        (their transfer would be refused: they must not wait out their deadline)."""
        everyone = bool(self.fault)
        for rid, exp in self._expected.items():
            if exp.installed or everyone:
                self.engine.release(rid)
                exp.events.put_nowait(DecodeEvent(kind="error", error=reason))

    async def decode(self, cmd: DecodeCommand) -> AsyncIterator[DecodeEvent]:
        rid = cmd.request_id
        if rid in self._expected:
            raise ValueError(f"request {rid} is already expected at {self.name}")
        try:
            prompt = unpack_tokens(cmd.prompt_tokens) if cmd.prompt_tokens else ()
            exp = _Expected(cmd, sampling_from(cmd.sampling), prompt)
            store = self.prefix_store
            if store is not None and cmd.prefix_tokens > 0:
                exp.prefix = store.lookup(
                    cmd.block_hashes, cmd.num_prompt_tokens, cmd.prefix_tokens
                )
        except Exception as exc:  # parameters the engine cannot honour: this request fails
            yield DecodeEvent(kind="error", error=_reason(exc))
            return
        if self.fault:
            yield DecodeEvent(kind="error", error=f"node {self.name}: {self.fault}")
            return
        self._expected[rid] = exp
        finished = False
        try:
            held = 0 if exp.prefix is None else exp.prefix.num_tokens
            yield DecodeEvent(kind="ready", prefix_tokens=held)
            deadline = time.monotonic() + cmd.timeout_s
            while True:
                # before the KV lands: the transfer deadline; after: generous per-step bound
                limit = deadline - time.monotonic() if not exp.installed else cmd.timeout_s
                try:
                    async with asyncio.timeout(max(limit, 0.0)):
                        event = await exp.events.get()
                except TimeoutError:
                    what = "tokens" if exp.installed else "the KV cache"
                    yield DecodeEvent(kind="error", error=f"timed out waiting for {what}")
                    return
                yield event
                if event.kind == "error" or event.finish_reason is not None:
                    finished = event.kind != "error"
                    return
        finally:
            self._expected.pop(rid, None)
            if not finished:
                self.engine.release(rid)  # aborted: free the KV and leave the batch
