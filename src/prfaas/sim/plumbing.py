"""What the simulator charges of the profiles' plumbing terms (``perf.plumbing``), and where.

``charged_cost_model`` is the cost model the simulated nodes run on: the profile's, with the
terms ``simulation.plumbing`` switches off set to 0 and the decode node's per-token relay folded
into its decode step. ``GatewayCpu`` is the gateway process: one FIFO server whose per-request
and per-output-token CPU delays each arrival's routing, on a core of its own, or, pinned to a
site's shared cores (``gateway.cpus``), taking its ``share`` of them (``processor.SharedCores``;
``docs/profiles.md``). Where each other term is charged (all as extra service time
in existing events, never an event per byte or token):

- ``prefill_per_request_s`` and ``prefill_per_token_s`` (per uncached token): added to the
  request's prefill service time on its prefill node (``simulator._assign``), whose forward
  passes are priced at ``1 + prefill_in_service_excess`` times the curve;
- ``decode_per_request_s``: added to its KV install on its decode node (``decode.DecodeStage``);
- ``decode_per_kv_byte_s``: the KV install on the decode node, per byte received (the transfer's
  bytes; a local prefill's whole prompt KV), before the request joins its batch: the batch
  pauses for it, on the decode node's core (slowed like its steps when the site's cores are
  shared). At a site whose prefill and decode node are one engine (``SimSite.
  local_kv_in_place``) a local prefill installs nothing: neither install term is charged;
- ``decode_per_step_s``: each decode step, once (whatever its batch);
- ``decode_per_output_token_s``: each decode step, per request of the batch;
- ``first_token_wait_s`` and ``first_token_wait_per_decoding_s``: latencies, not work: added to
  a request's first token (its TTFT) when its KV is ready at its decode node, once and per
  request decoding there.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from prfaas.perf import CostModel

if TYPE_CHECKING:
    from prfaas.sim.nodes import DecodeNode


def charged_cost_model(cm: CostModel, off: Iterable[str] = ()) -> CostModel:
    """``cm`` as the simulator charges it: terms in ``off`` zeroed, the relay in the step."""
    plumbing = cm.plumbing
    zeroed = {name: 0.0 for name in off}
    if zeroed:
        plumbing = replace(plumbing, **zeroed)  # type: ignore[arg-type]
    return replace(cm, plumbing=plumbing, relay_in_decode_step=True)


class GatewayCpu:
    """The gateway's CPU: each request's routing waits for the routing work ahead of it (FIFO,
    ``per_request_s`` each); its token relay (``per_output_token_s`` per output token) is the
    same CPU, but paid in small pieces while the request decodes, interleaved with other work on
    the gateway's event loop, so it never holds a later request's routing back. It is booked
    here all the same (``free_at_s``: when every request routed so far would be done, relay
    included), so a gateway whose total work outruns time shows as a growing backlog (the
    max-rate probe's ``gateway`` stage). ``route_at`` is when a request's routing can happen.

    (Before issue 20's fidelity rounds, the relay was booked ahead of the next routing, as one
    block: in a burst of 40 requests the last was routed ~1.6 s late in the simulator and ~0.3 s
    live, and the late routing let it find prefixes live could not.)"""

    __slots__ = ("decode_nodes", "free_at_s", "num_routed", "output_tokens_routed",
                 "per_output_token_s", "per_request_s", "per_step_s",
                 "route_free_at_s")  # fmt: skip

    def __init__(
        self, per_request_s: float, per_output_token_s: float,
        decode_nodes: Callable[[], Iterable[DecodeNode]] | None = None,
        per_step_s: float = 0.0,
    ) -> None:  # fmt: skip
        """``decode_nodes``: its home site's decode nodes now, whose tokens it relays (what
        ``share`` reads; None: it shares no node's cores). ``per_step_s``: its relay's cost
        once per decode step of those nodes (``gateway_per_step_s``)."""
        self.per_request_s = per_request_s
        self.per_output_token_s = per_output_token_s
        self.per_step_s = per_step_s
        self.decode_nodes = decode_nodes
        self.route_free_at_s = 0.0
        self.free_at_s = 0.0
        self.num_routed = 0
        self.output_tokens_routed = 0

    def _rates(self) -> tuple[float, float]:
        """(tokens, steps) per second its home's decode nodes emit now (their current batches
        and step times)."""
        tokens_per_s = steps_per_s = 0.0
        for dec in self.decode_nodes() if self.decode_nodes is not None else ():
            span_s = dec.tick_s - dec.span_start_s
            if dec.members and dec.tick_steps > 0 and 0.0 < span_s < float("inf"):
                steps_per_s += dec.tick_steps / span_s
                tokens_per_s += dec.span_batch * dec.tick_steps / span_s
        return tokens_per_s, steps_per_s

    def share(self) -> float:
        """The CPU it uses now, a fraction of one core: its relay, ``per_output_token_s`` for
        each token its home's decode nodes emit per second and ``per_step_s`` for each of their
        steps, and its routing, ``per_request_s`` spread over the mean output of the requests
        routed so far (in a steady state the routing rate is the token rate over the mean
        output). A rate, not its instants: a burst's first routing, before anything decodes,
        is not charged here (the routing FIFO still delays it)."""
        if self.decode_nodes is None:
            return 0.0
        tokens_per_s, steps_per_s = self._rates()
        if tokens_per_s == 0.0:
            return 0.0
        per_token = self.per_output_token_s
        if self.output_tokens_routed:
            per_token += self.per_request_s * self.num_routed / self.output_tokens_routed
        return per_token * tokens_per_s + self.per_step_s * steps_per_s

    def route_at(self, arrival_s: float, num_output_tokens: int) -> float:
        self.num_routed += 1
        self.output_tokens_routed += num_output_tokens
        start = arrival_s if arrival_s > self.route_free_at_s else self.route_free_at_s
        at = start + self.per_request_s
        self.route_free_at_s = at
        busy = self.free_at_s if self.free_at_s > arrival_s else arrival_s
        relay_s = self.per_output_token_s * num_output_tokens
        if self.per_step_s > 0.0:
            # Its share of the steps that will carry its tokens: the decode batches' now (each
            # token its own step while nothing decodes, the dearest case).
            tokens_per_s, steps_per_s = self._rates()
            ratio = steps_per_s / tokens_per_s if tokens_per_s > 0.0 else 1.0
            relay_s += self.per_step_s * num_output_tokens * ratio
        self.free_at_s = busy + self.per_request_s + relay_s
        return at

    def backlog_s(self, now_s: float) -> float:
        """Gateway work (routing and relay) booked and not yet done at ``now_s``."""
        return self.free_at_s - now_s if self.free_at_s > now_s else 0.0
