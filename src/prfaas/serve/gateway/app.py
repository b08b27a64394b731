"""The gateway process: ``serve.api``'s OpenAI surface in front of the ``ClusterDispatcher`` (the
*client* app), and the control plane on its own listener (the *control* app,
``gateway.control_port``): ``/internal/register`` and ``/internal/heartbeat`` (nodes),
``/internal/nodes``, ``/internal/endpoints``, ``/internal/routes``, ``/internal/control`` and
``/internal/nodes/{node}/drain|resume`` (``prfaas status`` / ``prfaas drain``, the demo),
``/internal/autoscale`` (the elastic pool's decisions: ``gateway.autoscale_board``). Every
control call must be signed with the deployment's key (``serve.auth``); the client port serves none
of them. The gateway's own calls to the nodes (dispatcher, control loop) are signed the same way.

The policy objects are the ones the simulator drives: the router from ``policy.make_router``, the
threshold ``t`` from the planner (``analytic``) unless the deployment fixes it. A pool tenant
(``pool:``) whose ``pool.tuner`` is coordinated or uncoordinated re-chooses ``t`` as the pool
simulator's tenants do (``pool.tenant_tuner``); its router (``pool.tenant_router.TenantRouter``)
reads its link to the pool from the pool's feedback, counts what it keeps home for that link, and,
coordinated, keeps an offload home while the pool queues it over its TTFT target.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException
from prometheus_client import Counter, Gauge

from prfaas.config import DeploymentConfig
from prfaas.core import MutableClusterView, NodeId, NodeRole, SiteId
from prfaas.policy import TuningConfig, make_router
from prfaas.policy.waiting_room import WaitingRoom
from prfaas.scenarios import deployment_cost_models, planned_threshold
from prfaas.serve import internal_errors
from prfaas.serve.api import GatewayHTTPConfig, GatewayMetrics, create_gateway_app
from prfaas.serve.api.api_keys import resolve_api_keys
from prfaas.serve.auth import Refusal, SignedAuth, Verifier
from prfaas.serve.auth_middleware import SignatureMiddleware
from prfaas.serve.backend import ModelInfo
from prfaas.serve.control_tls import client_options, control_tls
from prfaas.serve.gateway.autoscale_board import AutoscaleBoard, AutoscaleReport
from prfaas.serve.gateway.control import ControlLoop
from prfaas.serve.gateway.decision_log import DecisionLog
from prfaas.serve.gateway.dispatcher import ClusterDispatcher
from prfaas.serve.gateway.node_client import HttpNodeClient
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.keyring import KeyringHolder, ring_of_psks
from prfaas.serve.node.messages import Heartbeat, PrefixAckMsg, Registration

EXPIRY_PERIOD_S = 0.25
log = logging.getLogger("prfaas.gateway")


@dataclass(frozen=True, slots=True)
class GatewayApps:
    """The gateway's two listeners' apps: ``client`` (OpenAI surface, with the lifespan that runs
    the control loop) and ``control`` (signed ``/internal/*`` only)."""

    client: FastAPI
    control: FastAPI
    """The control routes, behind ``SignatureMiddleware``."""
    verifier: Verifier
    """The control listener's signature check (its ``refused`` counts by reason)."""
    keys: KeyringHolder
    """The gateway's keyring: its checks and its signed calls to nodes (a reload swaps it)."""


def create_cluster_gateway(d: DeploymentConfig, tokenizer: Any, model: ModelInfo) -> GatewayApps:
    if d.pool is not None:  # a tenant of a PrfaaS pool: the pool is its PrfaaS site (docs/pool.md)
        from prfaas.pool.tenant import with_pool_site

        d = with_pool_site(d)
    # The simulator's node order (sites as in the file; each site's prefill nodes, then its
    # decode nodes, as listed): ties between equally loaded nodes go the same way in both.
    order = [
        NodeId(n.name)
        for s in d.sites
        for role in ("prefill", "decode")
        for n in s.nodes
        if n.role == role
    ]
    registry_view = MutableClusterView(
        {SiteId(s.name): _site_kind(s.kind) for s in d.sites}, planned_threshold(d), order
    )
    registry = NodeRegistry(d, registry_view)
    remote, local = deployment_cost_models(d)
    home = SiteId(d.home_site.name)
    prfaas_sites = [SiteId(s.name) for s in d.sites if s.kind == "prfaas"]
    router = make_router(d.policy.router, home, prfaas_sites, remote=remote, local=local)
    fallback = make_router("local_only", home, prfaas_sites)
    metrics = GatewayMetrics()
    keys = KeyringHolder(ring_of_psks(d.psk, d.accept_psks))
    pool_link: Any = None
    node_client: Any = None
    pool_tuned = _pool_tuned(d, remote, local)
    if d.pool is not None:  # the pool node's prefills go to the pool's front door
        from prfaas.pool.tenant import PoolNodeClient, TenantPoolLink
        from prfaas.pool.tenant_router import TenantRouter

        pool_link = TenantPoolLink(d, registry, metrics.registry)
        node_client = PoolNodeClient(HttpNodeClient(SignedAuth(keys)), pool_link)
        # Its link's keeps counted; coordinated, the simulator's gate too: an offload stays
        # home while the pool queues it too long.
        gated = pool_tuned and d.pool.tuner == "coordinated" and local is not None
        router = TenantRouter(router, home, lambda: pool_link.feedback, metrics.registry,
                              d.pool.ttft_target_s if gated else None,
                              local if gated else None)  # fmt: skip
    dispatcher = ClusterDispatcher(
        registry, router, fallback, metrics, model, d.engine.block_tokens,
        route_log_size=d.gateway.route_log_size, node_auth=SignedAuth(keys),
        node_client=node_client,
        waiting_room=WaitingRoom(max_wait_s=d.gateway.path_wait_s),
    )  # fmt: skip
    g = d.gateway
    http = GatewayHTTPConfig(
        max_in_flight=g.max_inflight,
        max_queued=g.max_queued,
        request_timeout_s=g.request_timeout_s,
        queue_timeout_s=min(30.0, g.request_timeout_s),
        api_keys=resolve_api_keys(g.api_keys, os.environ),
    )
    app = create_gateway_app(dispatcher, tokenizer, http, metrics=metrics)
    app.state.registry = registry
    app.state.dispatcher = dispatcher
    control = ControlLoop(
        registry,
        remote,
        local,
        # A pool tenant's own tuner (pool.tuner) sets t; the gateway's would undo its choices.
        tune=d.policy.router == "prfaas" and not pool_tuned,
        rebalance=d.policy.rebalance,
        tuning=TuningConfig(min_samples=d.policy.tune_min_samples),
        interval_s=d.policy.control_interval_s,
    )
    dispatcher.control = control
    app.state.control_loop = control
    pool_tuner: Any = None
    if pool_tuned and remote is not None and local is not None:
        from prfaas.pool.tenant_tuner import TenantTuner

        pool_tuner = TenantTuner(d, control, lambda: pool_link.feedback, local, remote,
                                 metrics.registry)  # fmt: skip
    # Off unless configured: every route, decode placement, observation and tick, for a replay
    # through the simulator's policy objects (``sim/replay.py``).
    decisions = DecisionLog(g.decision_log) if g.decision_log else None
    dispatcher.planner.decisions = control.decisions = decisions
    period_s = min(EXPIRY_PERIOD_S, d.policy.control_interval_s * registry.time_scale)
    security = _SecurityMetrics(metrics)

    async def control_loop() -> None:
        tls = client_options(control_tls(d))
        async with httpx.AsyncClient(auth=SignedAuth(keys), trust_env=False, **tls) as client:
            while True:
                # Expiry at least every period_s; the policy on its modelled interval.
                await asyncio.sleep(min(period_s, control.wait_s(time.monotonic())))
                try:
                    await control.tick(client)
                    if pool_tuner is not None:  # a pool tenant's t, on its own period
                        pool_tuner.tick(registry.modelled_s(time.monotonic()))
                except Exception:  # a bad tick must not stop the control plane
                    log.exception("control loop")
                _export_gauges(registry, metrics)

    @app.on_event("startup")
    async def start() -> None:
        app.state.control = asyncio.create_task(control_loop())
        app.state.pool_lease = None
        if pool_link is not None:  # the tenant's lease at the pool
            app.state.pool_lease = asyncio.create_task(pool_link.run())

    @app.on_event("shutdown")
    async def stop() -> None:
        for task in (app.state.control, app.state.pool_lease):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        await dispatcher.aclose()
        if decisions is not None:
            decisions.close()

    internal = _control_app(registry, dispatcher, control, security, pool_tuner)
    _autoscale_routes(internal, AutoscaleBoard(metrics))
    verifier = Verifier(keys)
    internal.add_middleware(SignatureMiddleware, verifier=verifier, on_refused=security.refused)
    return GatewayApps(client=app, control=internal, verifier=verifier, keys=keys)


class _SecurityMetrics:
    """What the control plane refused, and the KV handshakes each node's receiver refused."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        r = metrics.registry
        self.auth_refused = Counter(
            "control_auth_refused", "Unsigned or badly signed calls to the control listener",
            ["code"], namespace="prfaas", registry=r,
        )  # fmt: skip
        self.handshake_failures = Gauge(
            "kv_handshake_failures",
            "KV-transfer handshakes a node's receiver refused since its process started "
            "(wrong key, bad HELLO): offloads to it fall back to local prefill",
            ["node"], namespace="prfaas", registry=r,
        )  # fmt: skip
        self.by_node: dict[str, int] = {}

    def refused(self, refusal: Refusal) -> None:
        self.auth_refused.labels(code=refusal.code).inc()

    def on_reports(self, beat: Heartbeat) -> None:
        for report in beat.reports:
            before = self.by_node.get(report.node, 0)
            now = report.handshake_failures
            if now > before:
                log.warning(
                    "node %s: %d KV handshake(s) refused since its last report (%d in all): a "
                    "peer with another key? offloads to it fall back to local prefill",
                    report.node, now - before, now,
                )  # fmt: skip
            self.by_node[report.node] = now
            self.handshake_failures.labels(node=report.node).set(now)


def _control_app(
    registry: NodeRegistry,
    dispatcher: ClusterDispatcher,
    control: ControlLoop,
    security: _SecurityMetrics,
    pool_tuner: Any = None,
) -> FastAPI:
    """The routes of the control listener (the caller wraps them in the signature check);
    ``pool_tuner``: a pool tenant's ``TenantTuner`` (None: none), in ``/internal/control``."""
    app = FastAPI(title="prfaas control", docs_url=None, redoc_url=None, openapi_url=None)
    internal_errors.install(app)

    @app.post("/internal/register")
    async def register(reg: Registration) -> dict[str, str]:
        try:
            registry.register(reg, time.monotonic())
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        return {"status": "registered"}

    @app.post("/internal/heartbeat")
    async def heartbeat(beat: Heartbeat) -> dict[str, object]:
        if not registry.heartbeat(beat, time.monotonic()):
            raise HTTPException(404, f"unknown process {beat.process}: register first")
        security.on_reports(beat)
        answer: dict[str, object] = {"status": "ok"}
        ack = registry.take_prefix_ack(beat.process)
        if ack is not None:  # what of its prefix report the gateway's mirror applied
            answer["prefix"] = PrefixAckMsg.of(ack).model_dump()
        return answer

    @app.get("/internal/routes")
    async def routes() -> list[dict[str, object]]:
        return [_record(r) for r in dispatcher.records]

    @app.get("/internal/endpoints")
    async def endpoints() -> list[dict[str, object]]:
        return [ep.model_dump() for ep in registry.endpoints.values()]

    @app.get("/internal/nodes")
    async def nodes() -> list[dict[str, object]]:
        return [_node_row(registry, n) for n in registry.view]

    @app.post("/internal/nodes/{node}/drain")
    async def drain(node: str) -> dict[str, object]:
        return _operate(registry, node, registry.drain)

    @app.post("/internal/nodes/{node}/resume")
    async def resume(node: str) -> dict[str, object]:
        return _operate(registry, node, registry.resume)

    @app.get("/internal/control")
    async def control_state() -> dict[str, object]:
        return {
            "threshold_tokens": registry.view.threshold_tokens,
            "window_requests": len(control.window),
            "window_rate_rps": control.window.rate_rps(),
            "ticks": control.num_ticks,
            "threshold_updates": control.log.threshold_updates,
            "role_changes": control.log.role_changes,
            "links": [
                {"link": s.link_id, "capacity_bytes_per_s": s.capacity_bytes_per_s,
                 "utilisation": s.utilisation, "backlog_bytes": s.backlog_bytes,
                 "rtt_s": s.rtt_s, "retransmit_rate": s.retransmit_rate,
                 "congested": s.congested, "capacity_basis": s.capacity_basis,
                 "goodput_bytes_per_s": s.goodput_bytes_per_s}
                for s in registry.link_states()
            ],
            "pool_tuner": None if pool_tuner is None else pool_tuner.state(),
        }  # fmt: skip

    return app


def _pool_tuned(d: DeploymentConfig, remote: Any, local: Any) -> bool:
    """Whether a pool tenant's own tuner sets ``t`` (``pool.tuner`` coordinated or
    uncoordinated; it prices with both sites' cost models, so a real engine without profile
    files keeps its file's ``t``, said once)."""
    if d.pool is None or d.pool.tuner == "fixed":
        return False
    if remote is None or local is None:
        log.warning("pool.tuner %s: no cost model prices this tenant's prefills (a real engine "
                    "needs profile files): t stays fixed", d.pool.tuner)  # fmt: skip
        return False
    return True


def _autoscale_routes(app: FastAPI, board: AutoscaleBoard) -> None:
    """The elastic pool's loop posts its decisions; status reads the last ones."""

    @app.post("/internal/autoscale")
    async def report(r: AutoscaleReport) -> dict[str, str]:
        try:
            board.record(r)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        return {"status": "ok"}

    @app.get("/internal/autoscale")
    async def autoscale() -> list[dict[str, object]]:
        return board.rows()


def _node_row(registry: NodeRegistry, n: Any) -> dict[str, object]:
    try:
        in_rotation, why_not = registry.rotation(n.node_id)
    except KeyError:  # in the view before its first report
        in_rotation, why_not = False, "not registered"
    report = registry.last_report.get(n.node_id)
    return {
        "node": n.node_id, "site": n.site_id, "role": n.role.value,
        "in_rotation": in_rotation, "why_not": why_not, "draining": n.draining,
        "healthy": n.healthy, "kv_used_bytes": n.kv_used_bytes,
        "in_flight": registry.in_flight(n.node_id), "queue_depth": n.queue_depth,
        "batch_size": n.batch_size,
        "handshake_failures": report.handshake_failures if report else 0,
        "decode_steps": report.decode_steps if report else 0,
        "reported_queue_depth": report.queue_depth if report else 0,
        "prefilled_tokens": report.prefilled_tokens if report else 0,
        "prefill_busy_s": report.prefill_busy_s if report else 0.0,
        "engine_cpu_s": report.engine_cpu_s if report else 0.0,
        "forward_cpu_s": report.forward_cpu_s if report else 0.0,
    }  # fmt: skip


def _operate(registry: NodeRegistry, node: str, action: Any) -> dict[str, object]:
    try:
        action(node)
        load = registry.view.node(NodeId(node))
    except KeyError:
        raise HTTPException(404, f"no node named {node!r} has registered") from None
    return _node_row(registry, load)


def _record(r: Any) -> dict[str, object]:
    return {k: getattr(r, k) for k in r.__slots__}


def _site_kind(kind: str) -> Any:
    from prfaas.core import SiteKind

    return SiteKind(kind)


def _export_gauges(registry: NodeRegistry, metrics: GatewayMetrics) -> None:
    for load in registry.view:
        is_prefill = load.role is NodeRole.PREFILL
        stage = "prefill_queue" if is_prefill else "decode_batch"
        value = load.queue_depth if is_prefill else load.batch_size
        metrics.stage_queue_depth.labels(stage=stage, node=load.node_id).set(value)
    for state in registry.link_states():
        metrics.link_utilisation.labels(link=state.link_id).set(state.utilisation)
        metrics.link_backlog_bytes.labels(link=state.link_id).set(state.backlog_bytes)
        metrics.cross_site_goodput_bytes_per_s.labels(link=state.link_id).set(
            state.goodput_bytes_per_s
        )
        metrics.link_congested.labels(link=state.link_id).set(1.0 if state.congested else 0.0)
