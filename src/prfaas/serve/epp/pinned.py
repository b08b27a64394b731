"""``PinnedPlanner``: the decode-side sidecar's ``AttemptPlanner``. The Endpoint Picker has decided
(its headers, carried into the request's context by ``ROUTE_PIN``): the decode node is this pod's
node the picker named, the prefill runs on the node it named with the prefix it counted. A retry
after a lost prefill (``use_fallback``), or a request the picker did not pin, falls back to the
gateway's own local route (the ``local_only`` router over this sidecar's registry), decode still
here. Everything else (commands, the exchange, retries, booking) is the gateway's dispatcher."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, replace

from prfaas.core import NodeId, SiteId
from prfaas.policy import Router
from prfaas.policy.decisions import RouteDecision
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.backend import GenerationError, GenerationRequest
from prfaas.serve.gateway.attempt import AttemptPlan, AttemptPlanner
from prfaas.serve.gateway.registry import NodeRegistry


@dataclass(frozen=True, slots=True)
class RoutePin:
    decode_node: str
    prefill_node: str
    num_cached_tokens: int


ROUTE_PIN: ContextVar[RoutePin | None] = ContextVar("prfaas_route_pin", default=None)
"""Set per request by the sidecar's middleware from the picker's headers."""


class PinnedPlanner(AttemptPlanner):
    def __init__(
        self,
        registry: NodeRegistry,
        fallback: Router,
        metrics: GatewayMetrics,
        own_nodes: frozenset[str],
    ) -> None:
        super().__init__(registry, fallback, fallback, metrics)
        self.own_nodes = own_nodes
        """The decode nodes of this pod: the only ones a request here may decode on."""

    def plan(
        self,
        req: GenerationRequest,
        hashes: tuple[int, ...],
        number: int,
        use_fallback: bool,
        avoid: frozenset[str] = frozenset(),
    ) -> AttemptPlan:
        pin = ROUTE_PIN.get()
        decode = pin.decode_node if pin is not None else min(self.own_nodes)
        if decode not in self.own_nodes or decode not in self.registry.endpoints:
            raise GenerationError(
                421, "invalid_request_error", f"decode node {decode!r} is not served here"
            )
        ep = None if pin is None else self.registry.endpoints.get(pin.prefill_node)
        if (
            pin is not None
            and ep is not None
            and not use_fallback
            and pin.prefill_node not in avoid
        ):
            home = SiteId(self.registry.deployment.home_site.name)
            site = SiteId(ep.site)
            decision = RouteDecision(
                prefill_site=site,
                prefill_node=NodeId(pin.prefill_node),
                num_cached_tokens=pin.num_cached_tokens,
                offloaded=site != home,
                reason="endpoint picker",
            )
            return AttemptPlan(number, f"{req.request_id}.{number}", decision, decode)
        plan = super().plan(req, hashes, number, True, avoid - {decode})
        return replace(plan, decode_node=decode)
