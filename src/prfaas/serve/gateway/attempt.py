"""``AttemptPlanner``: deciding one attempt of a request, with no node I/O. It builds the
``RequestView`` (every site's cached prefix from the registry's ``KVMirror``: what the nodes'
prefix stores reported), calls the shared router (or the local-only fallback after a lost prefill),
picks the decode node, and writes the commands the two nodes get: the decode node's prefix is what
its own process's store reported, and only the rest of the KV crosses. The dispatcher carries the
plan out through a ``NodeClient``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from prfaas.core import (
    ClusterView,
    LinkState,
    NodeId,
    NodeLoad,
    NodeRole,
    RequestId,
    RequestView,
    SiteId,
    SiteKind,
)
from prfaas.policy import DecodePlacement, NoRouteError, Router
from prfaas.policy.decision_log import place_record, route_record
from prfaas.policy.decisions import RouteDecision
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.backend import GenerationError, GenerationRequest
from prfaas.serve.gateway.decision_log import DecisionLog
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import DecodeCommand, PrefillCommand, SamplingMsg, pack_tokens

SEED_MODULUS = 2**63
"""Node seeds stay in the range every engine's generator accepts."""


@dataclass(frozen=True, slots=True)
class AttemptPlan:
    number: int
    """1 for the first attempt of a request."""
    attempt_id: str
    """The request's id at the nodes for this attempt: a retry must not collide with what is left
    of the attempt it replaces (a decode node frees a closed stream asynchronously)."""
    decision: RouteDecision
    decode_node: str


class NoPathError(GenerationError):
    """No node can take the request now (none in rotation): a 503 the dispatcher may first wait
    out (``policy.WaitingRoom``). ``missing`` names what is missing."""

    def __init__(self, missing: str, role: NodeRole) -> None:
        super().__init__(503, "service_unavailable", missing)
        self.missing = missing
        self.role = role
        """The role no node of which can take it (the 503 says why each is out)."""


class AttemptPlanner:
    def __init__(
        self,
        registry: NodeRegistry,
        router: Router,
        fallback: Router,
        metrics: GatewayMetrics,
    ) -> None:
        self.registry = registry
        self.router = router
        self.fallback = fallback
        self.kv = registry.kv
        self.metrics = metrics
        self.home = SiteId(registry.deployment.home_site.name)
        self.placement = DecodePlacement()
        """The decode node's choice: the simulator's, at the same point (routing time)."""
        self.decisions: DecisionLog | None = None
        """Where each route and decode placement is logged (``gateway.decision_log``)."""
        self.control: Any = None
        """The gateway's ``ControlLoop``; observes every routed request's lengths."""

    def plan(
        self,
        req: GenerationRequest,
        hashes: tuple[int, ...],
        number: int,
        use_fallback: bool,
        avoid: frozenset[str] = frozenset(),
    ) -> AttemptPlan:
        """Route the request now, on other nodes than ``avoid`` (where the request failed before)
        where there are others; ``GenerationError(503)`` when no node can take it."""
        n = len(req.prompt_token_ids)
        cached = self.kv.peek(hashes, n, time.monotonic())
        view = RequestView(RequestId(req.request_id), n, cached, hashes, req.max_tokens)
        now = self.registry.modelled_s(time.monotonic())
        router = self.fallback if use_fallback else self.router
        cluster: ClusterView = self.registry.view
        if avoid:
            cluster = _Avoiding(cluster, avoid)
        log = self.decisions
        which = "fallback" if use_fallback else "primary"
        try:
            decision = router.route(view, cluster, now)
        except NoRouteError as exc:
            if log is not None:
                log.write(route_record(which, view, cluster, now, None, str(exc)))
            raise NoPathError(f"no prefill node: {exc}", NodeRole.PREFILL) from None
        decode = self.placement.choose(cluster, self.home, now)
        if log is not None:
            log.write(route_record(which, view, cluster, now, decision, None))
            log.write(place_record(cluster, self.home, now, decode))
        if decode is None:
            raise NoPathError("no decode node in rotation", NodeRole.DECODE)
        # A bounded label set: the decision's own reason text names lengths.
        kind = "rerouted" if decision.rerouted else "cache_move" if decision.cache_move else "rule"
        self.metrics.route_decisions.labels(
            target="prfaas" if decision.offloaded else "local", reason=kind
        ).inc()
        if self.control is not None:
            self.control.observe(n - decision.num_cached_tokens, req.max_tokens)
        return AttemptPlan(number, f"{req.request_id}.{number}", decision, decode)

    def commands(
        self, req: GenerationRequest, hashes: tuple[int, ...], plan: AttemptPlan
    ) -> tuple[DecodeCommand, PrefillCommand]:
        """The decode and prefill nodes' commands. Call after any cache move: the decode node's
        store may hold the moved prefix, and then only the rest crosses."""
        n = len(req.prompt_token_ids)
        # What the decode node's own store holds (its process's reports): it pins that and the
        # prefill sends the rest. The node answers what it pinned; the dispatcher checks.
        store = self.registry.process_of(plan.decode_node)
        receiver_tokens = (
            0 if store is None else self.kv.cached_tokens(store, hashes, n, time.monotonic())
        )
        sampling = SamplingMsg(
            max_new_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=None if req.seed is None else req.seed % SEED_MODULUS,
            stop_token_ids=list(req.stop_token_ids),
            ignore_eos=req.ignore_eos,
            top_k=max(req.top_k, -1),
            min_tokens=req.min_tokens,
            repetition_penalty=req.repetition_penalty,
        )
        decode_ep = self.registry.endpoints[plan.decode_node]
        decode = DecodeCommand(
            request_id=plan.attempt_id,
            num_prompt_tokens=n,
            block_hashes=list(hashes),
            prefix_tokens=receiver_tokens,
            # The penalty counts prompt tokens too, and the decode node has only the KV; a vLLM
            # decode node sends the prompt to its server (which installs or recomputes its KV).
            prompt_tokens=pack_tokens(req.prompt_token_ids),
            prefill_node=plan.decision.prefill_node,
            sampling=sampling,
            timeout_s=self.registry.deployment.gateway.request_timeout_s,
        )
        prefill = PrefillCommand(
            request_id=plan.attempt_id,
            tokens=pack_tokens(req.prompt_token_ids),
            block_hashes=list(hashes),
            use_cached_tokens=plan.decision.num_cached_tokens,
            decode_node=plan.decode_node,
            decode_host=decode_ep.host,
            decode_transfer_port=decode_ep.transfer_port,
            cross_site=plan.decision.prefill_site != self.home,
            receiver_cached_tokens=receiver_tokens,
            decode_recomputes_last_token=self._runs_vllm(decode_ep.site),
            sampling=sampling,
        )
        return decode, prefill

    def _runs_vllm(self, site: str) -> bool:
        """A site of vLLM servers (the registry knows only the file's sites)."""
        return self.registry.deployment.engine_for(site).kind == "vllm"


class _Avoiding:
    """A ``ClusterView`` in which the nodes a request already failed at take no work, in every
    (site, role) group that has another node accepting (a lone node is tried again rather than
    failing the request)."""

    def __init__(self, inner: ClusterView, avoid: frozenset[str]) -> None:
        self._inner = inner
        self._avoid = avoid

    def site_ids(self) -> Sequence[SiteId]:
        return self._inner.site_ids()

    def site_kind(self, site_id: SiteId) -> SiteKind:
        return self._inner.site_kind(site_id)

    def nodes(self, site_id: SiteId, role: NodeRole) -> Sequence[NodeLoad]:
        loads = self._inner.nodes(site_id, role)
        if not any(n.accepting and n.node_id not in self._avoid for n in loads):
            return loads
        return tuple(replace(n, draining=True) if n.node_id in self._avoid else n for n in loads)

    def node(self, node_id: NodeId) -> NodeLoad:
        return self._inner.node(node_id)

    def link(self, src_site: SiteId, dst_site: SiteId) -> LinkState | None:
        return self._inner.link(src_site, dst_site)

    @property
    def threshold_tokens(self) -> int:
        return self._inner.threshold_tokens
