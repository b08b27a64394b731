"""In-memory nodes behind the dispatcher's ``NodeClient`` interface (no sockets), and a small
deployment to register them in. Each fake node follows the live protocol's order: the decode
stream answers ``ready``, waits for the prefill of the same attempt to deliver its KV, then emits
tokens; what a node does wrong is scripted per node."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.core import MutableClusterView, SiteId, SiteKind
from prfaas.core.link_report import SenderLinkReport
from prfaas.policy import make_router
from prfaas.policy.waiting_room import WaitingRoom
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.backend import GenerationRequest, ModelInfo
from prfaas.serve.gateway.dispatcher import ClusterDispatcher
from prfaas.serve.gateway.node_client import NodeCallFailed
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import (
    DecodeCommand,
    DecodeEvent,
    Heartbeat,
    NodeEndpoint,
    NodeReport,
    PrefillCommand,
    PrefillOutcome,
    PrefixPullCommand,
    Registration,
)

BLOCK_TOKENS = 16
THRESHOLD_TOKENS = 64

DEPLOYMENT = DeploymentConfig.model_validate(
    {
        "engine": {"kind": "timed", "model": "paper-1t", "block_tokens": BLOCK_TOKENS},
        "policy": {"router": "threshold", "threshold_tokens": THRESHOLD_TOKENS},
        "sites": [
            {"name": "remote", "kind": "prfaas", "hardware": "h200",
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": "h20",
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "p1", "role": "prefill"},
                       {"name": "d0", "role": "decode"}, {"name": "d1", "role": "decode"}]},
        ],
        "links": [{"src": "remote", "dst": "pd", "gbps": 100}],
        "psk": "unit-test-key-0123456789",
    }
)  # fmt: skip
SITE_OF = {"pf0": "remote", "p0": "pd", "p1": "pd", "d0": "pd", "d1": "pd"}
ROLE_OF = {"pf0": "prefill", "p0": "prefill", "p1": "prefill", "d0": "decode", "d1": "decode"}


@dataclass
class Script:
    """What a node does. ``None`` is the happy path."""

    decode: str | None = None
    """"unreachable" | "refuse" | "reject" | "error" (an error event after ready) |
    "cut" (stream cut after the first token) | "hang" (never sends the KV's tokens) |
    "recompute" (all tokens, the last event says the KV was not used: ``kv_recomputed``)."""
    prefill: str | None = None
    """"unreachable" | "refuse" | "reject" | "fail" (ok=False outcome) | "hang" | "late" (the KV
    is delivered, the answer waits for ``FakeNodes.answer_late``) | "hand_back" (a spot notice:
    the outcome says ``handed_back``)."""
    num_tokens: int = 3
    cached_tokens: int = 0
    pinned_tokens: int | None = None
    """Decode: the prefix the node pins (None: what the command says its store holds)."""
    stored_prefixes: list[tuple[int, int]] = field(default_factory=list)
    """Prefill: what the outcome says the node's store kept."""


@dataclass
class FakeNodes:
    """The in-memory ``NodeClient``."""

    scripts: dict[str, Script] = field(default_factory=dict)
    delivered: dict[str, asyncio.Event] = field(default_factory=dict)
    open_streams: set[str] = field(default_factory=set)
    running_prefills: set[str] = field(default_factory=set)
    aborted: list[str] = field(default_factory=list)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    """(node, "decode" | "prefill", attempt id), in call order."""
    prefill_commands: list[PrefillCommand] = field(default_factory=list)
    decode_commands: list[DecodeCommand] = field(default_factory=list)
    answer_late: asyncio.Event = field(default_factory=asyncio.Event)

    def script(self, node: str) -> Script:
        return self.scripts.setdefault(node, Script())

    def base_url(self, ep: NodeEndpoint) -> str:
        return f"mem://{ep.node}"

    def _event(self, request_id: str) -> asyncio.Event:
        return self.delivered.setdefault(request_id, asyncio.Event())

    @asynccontextmanager
    async def decode(
        self, ep: NodeEndpoint, cmd: DecodeCommand
    ) -> AsyncIterator[AsyncIterator[DecodeEvent]]:
        self.calls.append((ep.node, "decode", cmd.request_id))
        self.decode_commands.append(cmd)
        s = self.script(ep.node)
        if s.decode == "unreachable":
            raise NodeCallFailed(ep.node, "unreachable", "connection refused")
        if s.decode == "refuse":
            raise NodeCallFailed(ep.node, "refused", "HTTP 409: draining")
        if s.decode == "reject":
            raise NodeCallFailed(ep.node, "rejected", "HTTP 500: boom")
        self.open_streams.add(cmd.request_id)
        try:
            async with contextlib.aclosing(self._events(ep.node, cmd, s)) as events:
                yield events
        finally:
            self.open_streams.discard(cmd.request_id)

    async def _events(self, node: str, cmd: DecodeCommand, s: Script) -> AsyncIterator[DecodeEvent]:
        pinned = cmd.prefix_tokens if s.pinned_tokens is None else s.pinned_tokens
        yield DecodeEvent(kind="ready", prefix_tokens=pinned)
        await self._event(cmd.request_id).wait()
        if s.decode == "error":
            yield DecodeEvent(kind="error", error="engine failed for this request")
            return
        if s.decode == "hang":
            await asyncio.Event().wait()
        n = min(s.num_tokens, cmd.sampling.max_new_tokens)
        for i in range(n):
            if s.decode == "cut" and i == 1:
                raise NodeCallFailed(node, "unreachable", "RemoteProtocolError: peer closed")
            last = i == n - 1
            finish = "length" if last else None
            recomputed = last and s.decode == "recompute"
            yield DecodeEvent(
                kind="tokens", token_ids=[i], finish_reason=finish, kv_recomputed=recomputed
            )
            await asyncio.sleep(0)

    async def prefill(self, ep: NodeEndpoint, cmd: PrefillCommand) -> PrefillOutcome:
        self.calls.append((ep.node, "prefill", cmd.request_id))
        self.prefill_commands.append(cmd)
        s = self.script(ep.node)
        if s.prefill == "unreachable":
            raise NodeCallFailed(ep.node, "unreachable", "connection refused")
        if s.prefill == "refuse":
            raise NodeCallFailed(ep.node, "refused", "HTTP 409: not accepting prefills")
        if s.prefill == "reject":
            raise NodeCallFailed(ep.node, "rejected", "HTTP 500: boom")
        self.running_prefills.add(cmd.request_id)
        try:
            if s.prefill == "hang":
                await asyncio.Event().wait()
            if s.prefill == "fail":
                return PrefillOutcome(request_id=cmd.request_id, ok=False, error="engine: NaN")
            if s.prefill == "hand_back":
                return PrefillOutcome(request_id=cmd.request_id, ok=False, handed_back=True,
                                      error="handed back: a notice")  # fmt: skip
            self._event(cmd.request_id).set()
            if s.prefill == "late":
                await self.answer_late.wait()
            return PrefillOutcome(
                request_id=cmd.request_id, ok=True, first_token=0,
                num_cached_tokens=s.cached_tokens, kv_bytes_sent=100,
                stored_prefixes=s.stored_prefixes, store_epoch=1, store_seq=1,
            )  # fmt: skip
        finally:
            self.running_prefills.discard(cmd.request_id)

    async def abort(self, ep: NodeEndpoint, request_id: str) -> None:
        self.aborted.append(request_id)

    async def pull_prefix(self, dst: NodeEndpoint, cmd: PrefixPullCommand) -> bool:
        return False

    async def aclose(self) -> None:
        pass


def report(node: str, **changes: object) -> NodeReport:
    fields: dict[str, object] = {"node": node, "site": SITE_OF[node], "role": ROLE_OF[node]}
    return NodeReport.model_validate({**fields, **changes})


def make_registry() -> NodeRegistry:
    view = MutableClusterView(
        {SiteId(s.name): SiteKind(s.kind) for s in DEPLOYMENT.sites}, THRESHOLD_TOKENS
    )
    return NodeRegistry(DEPLOYMENT, view)


def register_all(registry: NodeRegistry, now_s: float = 0.0) -> None:
    for node in SITE_OF:
        registry.register(
            Registration(
                process=node,
                nodes=[NodeEndpoint(node=node, site=SITE_OF[node], role=ROLE_OF[node],
                                    host="mem", http_port=1, transfer_port=2)],
            ),
            now_s,
        )  # fmt: skip


def link_report(**fields: Any) -> SenderLinkReport:
    """The PrfaaS site's reading of its link to the PD site (not estimated unless ``basis``)."""
    base: dict[str, Any] = {
        "link": "remote->pd", "configured_bytes_per_s": 0.0, "pace_bytes_per_s": None,
        "capacity_bytes_per_s": 0.0, "basis": "", "backlog_bytes": 0,
    }  # fmt: skip
    return SenderLinkReport(**{**base, **fields})


def heartbeat(
    registry: NodeRegistry,
    node: str,
    now_s: float,
    link: SenderLinkReport | None = None,
    **changes: object,
) -> bool:
    """One heartbeat of ``node``'s process: its report with ``changes``, and ``link``."""
    beat = Heartbeat(process=node, reports=[report(node, **changes)], links=[link] if link else [])
    return registry.heartbeat(beat, now_s)


def make_dispatcher(
    nodes: FakeNodes, path_wait_s: float = 0.0
) -> tuple[ClusterDispatcher, NodeRegistry]:
    registry = make_registry()
    register_all(registry)
    home = SiteId("pd")
    dispatcher = ClusterDispatcher(
        registry, make_router("threshold", home, [SiteId("remote")]),
        make_router("local_only", home, [SiteId("remote")]), GatewayMetrics(),
        ModelInfo("paper-1t", 100_000), BLOCK_TOKENS, node_client=nodes, route_log_size=8,
        waiting_room=WaitingRoom(max_wait_s=path_wait_s, recheck_s=0.01),
    )  # fmt: skip
    return dispatcher, registry


def request(
    request_id: str = "r", num_prompt_tokens: int = 20, max_tokens: int = 3
) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id, prompt_token_ids=tuple(range(1, num_prompt_tokens + 1)),
        max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=None, stop_token_ids=(),
        arrival_s=0.0,
    )  # fmt: skip
