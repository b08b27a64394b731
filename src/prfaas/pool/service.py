"""The front door process of a running pool (``prfaas up pool.yaml`` starts it; ``docs/pool.md``).

One uvicorn server, two listeners (``serve.listeners``): ``front_door.port`` serves the tenants'
signed API v1 (``pool.app``) and an open ``/health``; ``front_door.control_port`` is the pool's
own listener, signed with the pool's internal key (``serve.auth_middleware``): the nodes register
and heartbeat there (``/internal/register``, ``/internal/heartbeat``, as they do at a gateway),
and the operator reads ``/internal/tenants`` (per-tenant counters, handed-back prefills among
them, the charge corrections at done outcomes, accepted key ids, each tenant's link: the rate
it told, the nodes' reading, and what the nodes' prefix stores hold for it per group; not
reachable with a tenant's key),
``/internal/nodes`` (each node's group, process, liveness, draining and what it runs) and, open
for Prometheus, ``/metrics`` (``pool.metrics``: the counters per tenant and per group). The
``PlacementDriver`` runs in the same event loop. SIGHUP reloads the tenant list and keys
(``TenantReload``).

The admission's clock is modelled seconds by a deployment gateway's rule
(``PoolFileConfig.wall_s_per_modelled_s``): wall over ``units.time_scale`` when the groups are
timed (the emulated nodes' cost models run that much faster), wall seconds when they are torch
(real engines compute in real time, whatever ``time_scale`` says); a pool mixing the two at a
``time_scale`` other than 1 is refused (``clock_conflict``). Everything the door times is on that
clock: leases, demand decay, rate caps, expected starts and retry hints. The lease is the file's
``lease_s`` of wall time either way. SIGINT/SIGTERM stop the server (uvicorn) and the driver.
``python -m prfaas.pool.service WORKDIR``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import sys
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from prfaas.engine.fingerprint import model_fingerprint
from prfaas.errors import UsageError
from prfaas.perf import CostModel, cost_model_for_hardware, is_profile_file
from prfaas.policy.pool_admission import prefill_node_s
from prfaas.pool.app import TenantKeys, create_app
from prfaas.pool.client import MAX_CONNECTIONS as TENANT_CONNECTIONS
from prfaas.pool.driver import PlacementDriver
from prfaas.pool.frontdoor import FrontDoor
from prfaas.pool.metrics import CORRECTIONS, OUTCOMES, pool_registry
from prfaas.pool.prefix_hits import PrefixHits
from prfaas.pool.resolved import internal_psk, load_resolved, tenant_keys
from prfaas.pool.tenant_links import link_json
from prfaas.pool.tenant_prefixes import prefixes_json
from prfaas.pool_file import pool_shape
from prfaas.pool_sections import PoolFileConfig, PoolGroup
from prfaas.serve import internal_errors
from prfaas.serve.auth import SignedAuth, Verifier
from prfaas.serve.auth_middleware import SignatureMiddleware
from prfaas.serve.gateway.node_client import HttpNodeClient
from prfaas.serve.keyring import ring_of_psks
from prfaas.serve.listeners import MAX_UNVERIFIED, PortRouter, UnverifiedConnections, bind, serve
from prfaas.serve.node.messages import Heartbeat, PrefixAckMsg, Registration
from prfaas.serve.node.prefix_namespaces import PrefixNamespaces

log = logging.getLogger("prfaas.pool")


def fingerprints(pool: PoolFileConfig) -> dict[str, dict[str, str]]:
    """What a submit's fingerprint must say per model (``engine.fingerprint``): the model's name
    and the pool's block size; a group with a model folder (torch, vLLM) its dtype, cache layout
    and weights digest too."""
    return {
        g.model: model_fingerprint(
            g.model, pool.units.block_tokens, g.model_path if g.kind != "timed" else None
        )
        for g in pool.groups
    }


def group_costs(group: PoolGroup) -> CostModel:
    """What prices a group's prefills for the admission (compute seconds, KV bytes): a timed
    group's model preset on its hardware, or a profile file (``prfaas profile``) for any engine;
    a torch group on a preset is priced from its model folder's own spec (``config.json``: its
    cache's bytes per token, its FLOPs) on that preset's roofline: relative costs are what fair
    sharing needs, and its KV bytes are the real ones. A prefill's price is
    ``policy.pool_admission.prefill_node_s`` of it: its forward pass and, from a profile file,
    the node's measured per-request CPU (the pool simulator prices it the same way)."""
    if group.kind == "timed" or is_profile_file(group.hardware):
        return cost_model_for_hardware(group.model, group.hardware)
    from prfaas.engine.torch.model_spec import model_spec_from_hf

    assert group.model_path is not None  # the schema requires it for torch and vLLM groups
    return cost_model_for_hardware(model_spec_from_hf(group.model_path), group.hardware)


class TenantReload:
    """SIGHUP: the tenant list and keys again from the resolved pool file (the launcher rewrote
    it from the operator's file). Applied at once: a key no longer listed is refused from the
    next call on (401), a tenant left without a key is revoked (its queued prefills dropped,
    its running ones aborted at their nodes, reason ``revoked``), a new tenant or a new key is
    accepted, weights and caps apply to the next decisions. A file that does not load, or in
    which no key resolves, changes nothing (logged)."""

    def __init__(self, workdir: Path, keys: TenantKeys, driver: PlacementDriver) -> None:
        self.workdir = workdir
        self.keys = keys
        self.driver = driver
        self.num_reloads = 0

    def __call__(self) -> bool:
        try:
            pool = load_resolved(self.workdir)
            found = tenant_keys(pool, self.workdir, on_missing=log.warning)
            active = {tenant for tenant, _ in found.values()}
            shares = [t for t in pool_shape(pool).tenants if t.name in active]
        except Exception as exc:  # a bad edit must not take the front door down
            log.error("tenant keys not reloaded: %s", exc)
            return False
        aborts = self.driver.set_tenants(shares)
        self.keys.replace(found)
        self.num_reloads += 1
        revoked = sorted(t for t in self.driver.counters if self.driver.door.revoked(t))
        log.warning("tenant keys reloaded: %s; revoked: %s; %d prefills aborted",
                    self.keys.key_ids(), revoked or "none", len(aborts))  # fmt: skip
        return True


def build(workdir: Path) -> tuple[FastAPI, FastAPI, PlacementDriver, PoolFileConfig, TenantReload]:
    """(tenant app, operator/node app, driver, the resolved pool file, its reload)."""
    pool = load_resolved(workdir)
    conflict = pool.clock_conflict()
    if conflict is not None:  # prfaas up refuses it before; a hand-made workdir stops here
        raise UsageError(conflict)
    scale = pool.wall_s_per_modelled_s
    keys = TenantKeys(tenant_keys(pool, workdir, on_missing=log.warning))
    epoch = int(time.time() * 1000) % 2**31  # a restarted door answers with another epoch

    def clock() -> float:
        return time.monotonic() / scale

    door = FrontDoor(pool_shape(pool), epoch, pool.lease_s / scale, fingerprints(pool))
    costs_of = {g.model: group_costs(g) for g in pool.groups}

    def costs(model: str, num_tokens: int) -> tuple[float, int] | None:
        cost = costs_of.get(model)
        if cost is None:
            return None
        return prefill_node_s(cost, num_tokens), cost.kv_bytes(num_tokens)

    internal_key = internal_psk(workdir)
    ring = ring_of_psks(internal_key)
    node_groups = {n: g.name for g in pool.groups for n in g.node_names}

    def compute_s(model: str, num_new: int, num_cached: int) -> float:
        return prefill_node_s(costs_of[model], num_new, num_cached)

    # The nodes' salts, drawn from the internal key as they draw them: the door computes each
    # prompt's chain in its tenant's namespace, to place it where its prefix is and charge it
    # what that node computes (docs/pool.md, Prefixes).
    salts = PrefixNamespaces.from_internal_key(
        internal_key, pool.prefix_shares(), pool.share_prefixes
    )
    hits = PrefixHits(salts, pool.units.block_tokens, compute_s)
    driver = PlacementDriver(
        door, node_groups, HttpNodeClient(SignedAuth(ring)), clock,
        node_timeout_s=max(3.0, 6 * pool.heartbeat_interval_s), prefix_hits=hits,
    )  # fmt: skip
    tenants = create_app(
        door, keys, costs, clock=clock, on_accepted=driver.accept, on_abort=driver.abort,
        egress=driver.egress, link_reading=driver.tenant_link, prefixes=driver.tenant_prefixes,
        wall_s_per_modelled_s=scale,
    )  # fmt: skip

    @tenants.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "epoch": door.epoch, "nodes_live": len(driver.live_nodes())}

    reload = TenantReload(workdir, keys, driver)
    return tenants, _operator_app(driver, ring, reload), driver, pool, reload


def _operator_app(driver: PlacementDriver, ring: Any, reload: TenantReload) -> FastAPI:
    app = FastAPI(title="prfaas pool (nodes, operator)", docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip
    internal_errors.install(app)
    # /metrics open like /health: Prometheus cannot sign (pool/metrics.py says why it may).
    app.add_middleware(SignatureMiddleware, verifier=Verifier(ring), exempt=("/health", "/metrics"))
    registry = pool_registry(driver, lambda: reload.num_reloads)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/internal/register")
    async def register(reg: Registration) -> dict[str, str]:
        try:
            driver.register(reg)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        return {"status": "registered"}

    @app.post("/internal/heartbeat")
    async def heartbeat(beat: Heartbeat) -> dict[str, object]:
        if not driver.heartbeat(beat):
            raise HTTPException(404, f"unknown process {beat.process}: register first")
        answer: dict[str, object] = {"status": "ok"}
        ack = driver.take_prefix_ack(beat.process)
        if ack is not None:  # what of its store's journal the door's mirror applied
            answer["prefix"] = PrefixAckMsg.of(ack).model_dump()
        return answer

    @app.get("/internal/nodes")
    async def nodes() -> list[dict[str, Any]]:
        return [
            {"node": name, "group": n.group, "process": n.process, "live": driver.live(name),
             "fault": n.fault, "draining": n.draining,
             "running": "/".join(driver.busy[name]) if name in driver.busy else ""}
            for name, n in sorted(driver.nodes.items())
        ]  # fmt: skip

    @app.get("/internal/tenants")
    async def tenants() -> dict[str, Any]:
        now = driver.clock()
        out: dict[str, Any] = {}
        key_ids = reload.keys.key_ids()
        for name, counts in driver.counters.items():
            fb = driver.door.feedback(name, now)
            out[name] = {
                **{k: counts[k] for k in OUTCOMES},
                "charge_corrections": {k: counts[k] for k in CORRECTIONS},
                "queued_tokens": fb.queued_tokens,
                "running": fb.running,
                "attainable_share": fb.attainable_share,
                "link": link_json(driver.door.link_of(name), driver.tenant_link(name)),
                "prefixes": prefixes_json(driver.tenant_prefixes(name)),
                "keys": key_ids.get(name, []),
                "revoked": driver.door.revoked(name),
            }
        return {"epoch": driver.door.epoch, "key_reloads": reload.num_reloads, "tenants": out}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "epoch": driver.door.epoch, "nodes_live": len(driver.live_nodes())}

    return app


def run(workdir: Path) -> None:
    tenants, operator, driver, pool, reload = build(workdir)
    door = pool.front_door
    tenant_sock = bind(door.host, door.port)
    control_sock = bind(door.host, door.control_port)
    router = PortRouter(tenants, {control_sock.getsockname()[1]: operator})
    tls: dict[int, ssl.SSLContext] = {}
    if door.tls is not None:  # the tenants' port only: the pool's own listener stays in-house
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(door.tls.cert, door.tls.key)
        tls[tenant_sock.getsockname()[1]] = ctx

    async def main() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
        loop = asyncio.create_task(driver.run())
        try:
            # Signed callers only on both ports; the quota holds unverified connections down. It
            # leaves room for every tenant's gateway opening all its connections at once (a burst
            # of submits, before any has verified): with the bare quota two tenants bursting at
            # once had their oldest connections cut (seen as ReadErrors under load).
            quota = MAX_UNVERIFIED + TENANT_CONNECTIONS * len(pool.tenants)
            await serve(router, [tenant_sock, control_sock],
                        unverified=UnverifiedConnections(quota), tls=tls)  # fmt: skip
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
            await driver.aclose()

    asyncio.run(main())


if __name__ == "__main__":
    run(Path(sys.argv[1]))
