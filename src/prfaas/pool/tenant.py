"""A tenant gateway's side of a PrfaaS pool (``docs/pool.md``): a tenant file's ``pool:`` section,
live.

The tenant's gateway routes with the same policy objects as a two-site deployment: the pool is,
to its router and registry, one PrfaaS site named ``pool`` with one prefill node ``pool``
(``with_pool_site``; its link is the tenant's own, from ``pool.link``). That node is kept in the
registry by ``TenantPoolLink``, not by a node process: each answered heartbeat to the front door
is a heartbeat of the ``pool`` node (its queue from the pool's feedback), so a silent pool leaves
rotation after the gateway's ``heartbeat_timeout_s`` and the router prefills locally. The link
also registers the tenant's decode nodes' pool receivers (``NodeEndpoint.pool_transfer_port``:
each decode process's receiver keyed by the tenant's pool key) with the pool, with the tenant's
own link rate (``pool.link``: the pool's nodes pace this tenant's KV at it), and keeps the
pool's last ``Feedback`` (``feedback``: queueing, shares, and the tenant's own link as the pool's
nodes read it). The ``pool`` node's heartbeat carries that link as a PrfaaS node process's does
(``pool.feedback_link.pool_node_rows``: the ``pool -> home`` link's ``SenderLinkReport`` and the
node's unsent KV), so the registry builds the link's ``LinkState`` with its one rule and a
bandwidth-aware router (``policy.router``'s ``prfaas``) reads the tenant's link to the pool as it
reads a PrfaaS site's link.

``PoolNodeClient`` is the dispatcher's ``NodeClient``: a prefill for the ``pool`` node is a signed
submit (tokens, sampling, the decode node as registered receiver, the prefill's request id as the
session its KV goes to), then the outcome is awaited (a done one's ``kv_bytes_sent`` and
``cached_tokens``, the prompt tokens the pool's node found in the tenant's prefixes there, are
the node outcome's: the gateway's route log and the ``pool`` site's prefix hit rate count them as
a PrfaaS node's, and the gateway, which mirrors no pool store, counts no stale mirror for it);
the KV goes from the pool node straight to the decode node; a request whose client goes away is
aborted at the pool (``POST /v1/abort``). A refusal, an unreachable or silent pool, a changed
epoch, or a failed or aborted prefill (a lost pool node, a lost lease) fails the attempt, and the
dispatcher's retry prefills locally; each such fallback is counted by reason
(``prfaas_pool_fallbacks_total{reason}``), each offload that completed in
``prfaas_pool_offloads_total{outcome}``. Every other call goes to the tenant's own nodes through
the wrapped client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter

from prfaas.config import DeploymentConfig
from prfaas.core.ids import SiteId, link_id_for
from prfaas.engine.fingerprint import engine_fingerprint
from prfaas.policy.pool_session import PoolSession
from prfaas.policy.pool_tenant_route import POOL_NODE, POOL_SITE
from prfaas.pool.client import Feedback, PoolClient, PoolUnreachable, Refusal, pool_verify
from prfaas.pool.feedback_link import pool_node_rows
from prfaas.pool.site import POOL_SITE_HARDWARE, with_pool_site
from prfaas.pool_file import resolve_key
from prfaas.serve.gateway.node_client import NodeCallFailed, NodeClient
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import (
    DecodeCommand,
    DecodeEvent,
    Heartbeat,
    NodeEndpoint,
    PrefillCommand,
    PrefillOutcome,
    PrefixPullCommand,
    Registration,
    unpack_tokens,
)

POOL_PROCESS = "pool-front-door"
OUTCOME_POLL_S = 0.2
"""How often a submitted prefill's outcome is asked for: its KV goes straight to the decode node,
so this paces only the booking of its answer (and the load on the front door)."""
log = logging.getLogger("prfaas.gateway")
__all__ = [
    "POOL_NODE", "POOL_SITE", "POOL_SITE_HARDWARE", "PoolNodeClient", "TenantPoolLink",
    "tenant_fingerprint", "with_pool_site",
]  # fmt: skip


class TenantPoolLink:
    """The tenant's lease at the pool: receivers, heartbeats, and the ``pool`` node's presence in
    the gateway's registry."""

    def __init__(self, d: DeploymentConfig, registry: NodeRegistry, metrics: CollectorRegistry):
        assert d.pool is not None
        self.ref = d.pool
        self.deployment = d
        self.registry = registry
        key = resolve_key(self.ref.key, Path.cwd(), "pool.key")
        self.client = PoolClient(self.ref.url, self.ref.key.id, key,
                                 verify=pool_verify(self.ref.ca),
                                 server_hostname=self.ref.server_hostname)  # fmt: skip
        # The same window a silent node leaves rotation in: with a shorter one the router
        # still picked the ``pool`` node (in rotation) and every offload failed at once as
        # ``pool_silent``, its prefix then cached at home keeping the rest local.
        self.session = PoolSession(silence_s=d.gateway.heartbeat_timeout_s)
        self.fingerprint = tenant_fingerprint(d)
        self.fallbacks = Counter(
            "pool_fallbacks",
            "Offloads to the PrfaaS pool given up on, by reason: prefilled locally (the "
            "dispatcher's retry) unless their KV had already reached the decode node",
            ["reason"], namespace="prfaas", registry=metrics,
        )  # fmt: skip
        self.offloads = Counter(
            "pool_offloads",
            "Prefills submitted to the PrfaaS pool, by outcome (accepted, done, aborted: the "
            "client went away and the pool gave it up)",
            ["outcome"], namespace="prfaas", registry=metrics,
        )  # fmt: skip
        self._registered: tuple[tuple[str, str, int], ...] | None = None
        self._epoch_registered: int | None = None
        """The epoch of the door our receivers are registered with (None: register next)."""
        url = urlsplit(self.ref.url)
        self._endpoint = NodeEndpoint(
            node=POOL_NODE, site=POOL_SITE, role="prefill",
            host=url.hostname or "", http_port=url.port or 80,
        )  # fmt: skip
        self.feedback: Feedback | None = None
        """The pool's last feedback (None: none yet)."""
        self._link_id = link_id_for(SiteId(POOL_SITE), SiteId(d.home_site.name))
        self._told_bytes_per_s = self.ref.link.gbps * 1e9 / 8
        # The pool site's bytes as the registry converts a node's (``with_pool_site``'s engine).
        self._byte_divisor = d.engine.real_bytes_per_payload_byte

    def fallback(self, reason: str) -> None:
        self.fallbacks.labels(reason=reason).inc()

    def _receivers(self) -> tuple[tuple[str, str, int], ...]:
        return tuple(
            sorted(
                (ep.node, ep.host, ep.pool_transfer_port)
                for ep in self.registry.endpoints.values()
                if ep.role == "decode" and ep.pool_transfer_port > 0
            )
        )

    async def run(self) -> None:
        """Forever: keep the lease (register receivers when they or the epoch change, else
        heartbeat) and the ``pool`` node's row fresh. Never raises (a pool that does not answer
        is the registry's silent node)."""
        period_s = self.deployment.heartbeat_interval_s
        while True:
            try:
                await self._beat()
            except PoolUnreachable as exc:
                log.debug("pool %s: %s", self.ref.url, exc)
            except Exception:  # a bad beat must not end the lease loop
                log.exception("pool lease")
            await asyncio.sleep(period_s)

    async def _beat(self) -> None:
        receivers = self._receivers()
        if receivers != self._registered or self._epoch_registered is None:
            body = [{"name": n, "host": h, "transfer_port": p} for n, h, p in receivers]
            answer = await self.client.register(body, (self.ref.link.gbps, self.ref.link.rtt_ms))
            if isinstance(answer, Refusal):
                log.warning("pool %s refused our receivers: %s", self.ref.url, answer.message)
                return
            self._registered = receivers
            self._epoch_registered = int(answer["epoch"])
        else:
            answer = await self.client.heartbeat()
            if isinstance(answer, Refusal):
                log.warning("pool %s refused our heartbeat: %s", self.ref.url, answer.message)
                return
            if int(answer["epoch"]) != self._epoch_registered:
                # A restarted front door: it knows neither our receivers nor our lease.
                self._epoch_registered = None
        now = time.monotonic()
        self.session.heard(int(answer["epoch"]), now)
        if self._epoch_registered is None:
            return
        try:
            fb = await self.client.feedback()
        except ValueError as exc:  # the door answered (alive); its feedback is kept as it was
            log.warning("pool %s: feedback not understood: %s", self.ref.url, exc)
        else:
            if not isinstance(fb, Refusal):
                self.feedback = fb
        self._node_alive(now)

    def _node_alive(self, now_s: float) -> None:
        """The ``pool`` node's heartbeat from the latest feedback: its queue, and the tenant's
        link to the pool as a PrfaaS node process reports its link (``pool_node_rows``)."""
        report, links = pool_node_rows(
            self.feedback, node=POOL_NODE, site=POOL_SITE, link_id=self._link_id,
            told_bytes_per_s=self._told_bytes_per_s, byte_divisor=self._byte_divisor,
        )  # fmt: skip
        beat = Heartbeat(process=POOL_PROCESS, reports=[report], links=links)
        if not self.registry.heartbeat(beat, now_s):
            reg = Registration(process=POOL_PROCESS, nodes=[self._endpoint], reports=[report])
            self.registry.register(reg, now_s)
            self.registry.heartbeat(beat, now_s)  # a registration carries no link readings

    async def prefill(self, cmd: PrefillCommand) -> PrefillOutcome:
        """Submit ``cmd`` to the pool and wait for its outcome; ``NodeCallFailed`` (the dispatcher
        then prefills locally) with the fallback counted when it is not done."""
        rid = cmd.request_id
        now = time.monotonic()
        if not self.session.usable(now):
            raise self._fail("pool_silent", "unreachable", "the pool has been silent")
        if self._registered is not None and cmd.decode_node not in {
            n for n, _, _ in self._registered
        }:
            # A decode node that registered here after the lease loop's last registration at
            # the pool (it catches up within a beat): register it now, or the pool refuses the
            # submit (receiver_not_registered) and a request right after start-up goes local.
            try:
                await self._beat()
            except PoolUnreachable as exc:
                raise self._fail("pool_unreachable", "unreachable", str(exc)) from None
        num_tokens = len(unpack_tokens(cmd.tokens))
        d = self.deployment
        body = {
            "tenant": self.ref.tenant, "request_id": rid, "model": d.engine.model,
            "fingerprint": self.fingerprint,
            "num_uncached_tokens": max(1, num_tokens - cmd.receiver_cached_tokens),
            "receiver": cmd.decode_node, "session": rid, "tokens": cmd.tokens,
            "sampling": cmd.sampling.model_dump(),
            "receiver_cached_tokens": cmd.receiver_cached_tokens,
            "decode_recomputes_last_token": cmd.decode_recomputes_last_token,
        }  # fmt: skip
        try:
            answer = await self.client.submit(body)
        except PoolUnreachable as exc:
            raise self._fail("pool_unreachable", "unreachable", str(exc)) from None
        if isinstance(answer, Refusal):
            if answer.epoch is not None and answer.epoch != self._epoch_registered:
                self._epoch_registered = None  # a restarted door: register at the next beat
            raise self._fail(f"refused:{answer.reason}", "rejected", answer.message)
        epoch = answer.epoch
        self.session.heard(epoch, time.monotonic())
        self.offloads.labels(outcome="accepted").inc()
        while True:
            await asyncio.sleep(OUTCOME_POLL_S)
            try:
                out = await self.client.outcome(rid)
            except PoolUnreachable:
                if time.monotonic() - self.session.last_heard_s > self.session.silence_s:
                    raise self._fail("pool_silent", "unreachable", "the pool went silent") from None
                continue
            if isinstance(out, Refusal):
                # A front door that does not know the request restarted since (a new epoch).
                if out.reason == "unknown_request" or (
                    out.epoch is not None and out.epoch != epoch
                ):
                    raise self._fail("epoch_changed", "rejected", "the front door restarted")
                raise self._fail(f"failed:{out.reason}", "rejected", out.message)
            self.session.heard(int(out["epoch"]), time.monotonic())
            if int(out["epoch"]) != epoch:
                raise self._fail("epoch_changed", "rejected", "the front door restarted")
            state = out["state"]
            if state == "done":
                self.offloads.labels(outcome="done").inc()
                sent = int(out.get("kv_bytes_sent") or 0)  # an older door: not said
                # What the pool's node found in the tenant's prefixes there: the route log and
                # the pool site's prefix hit rate count it as a PrfaaS node's own outcome.
                cached = int(out.get("cached_tokens") or 0)
                return PrefillOutcome(request_id=rid, ok=True, kv_bytes_sent=sent,
                                      num_cached_tokens=cached)  # fmt: skip
            if state in ("failed", "aborted"):
                reason = str(out.get("reason") or state).split(":")[0]
                raise self._fail(f"failed:{reason}", "rejected", f"pool: {state} {out['reason']}")

    async def abort(self, request_id: str) -> None:
        """The request's client went away: the pool drops its prefill from the queue or stops
        it at its node (a shared node is not spent on it); counted ``outcome="aborted"``."""
        with contextlib.suppress(PoolUnreachable):  # a pool away: nothing of ours runs there
            answer = await self.client.abort(request_id)
            if not isinstance(answer, Refusal):
                self.offloads.labels(outcome="aborted").inc()

    def _fail(self, reason: str, kind: str, message: str) -> NodeCallFailed:
        self.fallback(reason)
        assert kind in ("unreachable", "rejected")
        return NodeCallFailed(POOL_NODE, "unreachable" if kind == "unreachable" else "rejected",
                              f"pool: {reason}: {message}")  # fmt: skip

    async def aclose(self) -> None:
        await self.client.aclose()


class PoolNodeClient:
    """The dispatcher's ``NodeClient``: the ``pool`` node's prefills go to the pool, every other
    call to the tenant's nodes through ``inner``."""

    def __init__(self, inner: NodeClient, link: TenantPoolLink) -> None:
        self.inner = inner
        self.link = link

    def decode(
        self, ep: NodeEndpoint, cmd: DecodeCommand
    ) -> AbstractAsyncContextManager[AsyncIterator[DecodeEvent]]:
        return self.inner.decode(ep, cmd)

    async def prefill(self, ep: NodeEndpoint, cmd: PrefillCommand) -> PrefillOutcome:
        if ep.node == POOL_NODE:
            return await self.link.prefill(cmd)
        return await self.inner.prefill(ep, cmd)

    async def abort(self, ep: NodeEndpoint, request_id: str) -> None:
        if ep.node == POOL_NODE:
            await self.link.abort(request_id)
        else:
            await self.inner.abort(ep, request_id)

    async def pull_prefix(self, dst: NodeEndpoint, cmd: PrefixPullCommand) -> bool:
        if dst.node == POOL_NODE:
            return False  # no prefix moves into the pool (its prefixes are not modelled live)
        return await self.inner.pull_prefix(dst, cmd)

    def base_url(self, ep: NodeEndpoint) -> str:
        return self.inner.base_url(ep)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.link.aclose()
        await self.inner.aclose()


def tenant_fingerprint(d: DeploymentConfig) -> dict[str, str]:
    """The fingerprint of the model the tenant's decode nodes run (``engine.fingerprint``): its
    PD site's engine; a model folder that cannot be read leaves the folder's fields out (the
    pool then refuses the submits naming the field, and the tenant prefills locally)."""
    (site,) = [s.name for s in d.sites if s.kind == "pd"]
    e = d.engine_for(site)
    return dict(engine_fingerprint(e.model, e.block_tokens, e.kind, e.model_path))
