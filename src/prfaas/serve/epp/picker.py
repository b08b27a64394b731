"""``EndpointPicker``: one request's endpoint, decided as the gateway decides it.

The request body is validated and tokenized by the gateway's own ``prepare`` (so a bad body is
the gateway's 4xx), its block hashes looked up in the registry's ``KVMirror``, and the route
planned by the gateway's ``AttemptPlanner`` (the router of ``policy/router.py`` over the
registry's ``ClusterView``, then ``policy.DecodePlacement``): the picked endpoint is the decode
node's pod; when the router sends the prefill elsewhere (a long uncached prompt to a PrfaaS site)
the request carries the prefill node in headers the decode-side sidecar acts on
(``x-prefiller-host-port``, llm-d's name, and ``x-prfaas-prefill-node``). Fallbacks follow, in
the placement's order (fewest requests held first, ties in the file's order).

Shedding: the file's admission limits (``gateway.max_inflight + max_queued``) over the requests
the decode nodes report holding: 429 past them. No decode node in rotation (or none in the
subset hint): 503."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prfaas.core import NodeRole, SiteId
from prfaas.policy.placement import decode_load_key
from prfaas.serve.api.config import GatewayHTTPConfig
from prfaas.serve.api.errors import ApiError
from prfaas.serve.api.prepare import parse_json, prepare
from prfaas.serve.backend import GenerationError, ModelInfo
from prfaas.serve.gateway.attempt import AttemptPlanner
from prfaas.serve.gateway.hashing import block_hashes
from prfaas.serve.gateway.registry import NodeRegistry

PREFILLER_HEADER = "x-prefiller-host-port"
PREFILL_NODE_HEADER = "x-prfaas-prefill-node"
PREFILL_SITE_HEADER = "x-prfaas-prefill-site"
DECODE_NODE_HEADER = "x-prfaas-decode-node"
ROUTE_HEADER = "x-prfaas-route"
CACHED_TOKENS_HEADER = "x-prfaas-cached-tokens"


class Refused(Exception):
    """The picker answers the client itself: ``status`` with an OpenAI-style error."""

    def __init__(self, status: int, message: str, error_type: str, code: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.code = code


@dataclass(frozen=True, slots=True)
class Pick:
    endpoints: tuple[str, ...]
    """``ip:port`` of decode pods, the chosen one first, then the fallbacks in order."""
    decode_node: str
    prefill_node: str
    prefill_site: str
    offloaded: bool
    """The prefill runs at another site than the decode node's (a PrfaaS site)."""
    headers: tuple[tuple[str, str], ...]
    request_id: str = ""
    num_prompt_tokens: int = 0
    num_uncached_tokens: int = 0


class EndpointPicker:
    def __init__(
        self,
        registry: NodeRegistry,
        planner: AttemptPlanner,
        tokenizer: Any,
        model: ModelInfo,
        http: GatewayHTTPConfig,
        endpoint_port: int | None,
    ) -> None:
        self.registry = registry
        self.planner = planner
        self.tokenizer = tokenizer
        self.model = model
        self.http = http
        self.endpoint_port = endpoint_port
        """The decode pods' OpenAI port (the sidecar's); None: the node's own HTTP port."""
        self.home = SiteId(registry.deployment.home_site.name)

    def endpoint_of(self, node: str) -> str:
        ep = self.registry.endpoints[node]
        port = self.endpoint_port or ep.http_port
        host = f"[{ep.host}]" if ":" in ep.host else ep.host
        return f"{host}:{port}"

    def _decode_candidates(self, subset: frozenset[str] | None) -> list[Any]:
        loads = [
            load
            for load in self.registry.view.nodes(self.home, NodeRole.DECODE)
            if load.accepting
            and str(load.node_id) in self.registry.endpoints
            and self.registry.rotation(str(load.node_id))[0]
        ]
        if subset is not None:
            loads = [x for x in loads if self.endpoint_of(str(x.node_id)) in subset]
        return loads

    def pick(self, path: str, raw_body: bytes, subset: frozenset[str] | None) -> Pick:
        candidates = self._decode_candidates(subset)
        if not candidates:
            why = "in the subset hint" if subset is not None else "in rotation"
            raise Refused(
                503, f"no ready decode endpoint {why}", "service_unavailable", "no_ready_endpoint"
            )
        held = sum(decode_load_key(x) for x in self.registry.view.nodes(self.home, NodeRole.DECODE))
        if held >= self.http.max_in_flight + self.http.max_queued:
            raise Refused(
                429,
                f"overloaded: {held} requests held by the decode nodes",
                "rate_limit_exceeded",
                "overloaded",
            )
        chat = path.split("?")[0].rstrip("/").endswith("/chat/completions")
        generation = chat or path.split("?")[0].rstrip("/").endswith("/completions")
        allowed = {str(x.node_id) for x in candidates}
        ordered = sorted(candidates, key=decode_load_key)  # stable: the view's (file) order
        if not generation:  # /v1/models and the like: any ready decode pod answers them
            first = str(ordered[0].node_id)
            endpoints = tuple(self.endpoint_of(str(x.node_id)) for x in ordered)
            return Pick(endpoints, first, "", "", False, ((DECODE_NODE_HEADER, first),))
        try:
            prepared = prepare(
                parse_json(raw_body),
                chat=chat,
                info=self.model,
                tokenizer=self.tokenizer,
                config=self.http,
                arrival_s=time.monotonic(),
            )
        except ApiError as exc:
            raise Refused(exc.status, exc.message, exc.error_type, exc.code) from None
        req = prepared.req
        hashes = block_hashes(req.prompt_token_ids, self.registry.deployment.engine.block_tokens)
        avoid = frozenset(
            str(x.node_id)
            for x in self.registry.view.nodes(self.home, NodeRole.DECODE)
            if str(x.node_id) not in allowed
        )
        try:
            plan = self.planner.plan(req, hashes, 1, False, avoid)
        except GenerationError as exc:
            raise Refused(503, exc.message, "service_unavailable", "no_route") from None
        decision = plan.decision
        fallbacks = [str(x.node_id) for x in ordered if str(x.node_id) != plan.decode_node]
        endpoints = tuple(self.endpoint_of(n) for n in (plan.decode_node, *fallbacks))
        prefill_site = str(decision.prefill_site)
        offloaded = decision.prefill_site != self.home
        headers = [
            (DECODE_NODE_HEADER, plan.decode_node),
            (PREFILL_NODE_HEADER, str(decision.prefill_node)),
            (PREFILL_SITE_HEADER, prefill_site),
            (ROUTE_HEADER, "offloaded" if offloaded else "local"),
            (CACHED_TOKENS_HEADER, str(decision.num_cached_tokens)),
        ]
        if offloaded:
            ep = self.registry.endpoints.get(str(decision.prefill_node))
            if ep is not None:
                headers.append((PREFILLER_HEADER, f"{ep.host}:{ep.http_port}"))
        headers.append(("x-request-id", req.request_id))
        return Pick(
            endpoints,
            plan.decode_node,
            str(decision.prefill_node),
            prefill_site,
            offloaded,
            tuple(headers),
            req.request_id,
            len(req.prompt_token_ids),
            len(req.prompt_token_ids) - decision.num_cached_tokens,
        )

    def hold(self, pick: Pick) -> None:
        """Count the request against its nodes until ``release``: the gateway's own count of
        what it placed (``NodeRegistry.track``), which is the decode loads' source."""
        if not pick.request_id:
            return
        self.registry.track(pick.prefill_node, pick.request_id, pick.num_uncached_tokens)
        self.registry.track(pick.decode_node, pick.request_id, pick.num_prompt_tokens)

    def release(self, pick: Pick) -> None:
        if not pick.request_id:
            return
        self.registry.untrack(pick.prefill_node, pick.request_id)
        self.registry.untrack(pick.decode_node, pick.request_id)
