"""The node process's internal HTTP API (called by the gateway and by other workers only). Every
route but ``/health`` needs a request signed with the deployment's key (``serve.auth``, 401
otherwise); ``/health`` tells liveness and loads, never ports.

``POST /nodes/{node}/prefill``   PrefillCommand -> PrefillOutcome (once the KV is verified there)
``POST /nodes/{node}/prefill/stream`` the same, as NDJSON ``PrefillStep`` lines: ``computed`` once
                                 its compute is done and its KV handed to the link, then the
                                 outcome (a pool's front door: it frees the node at ``computed``)
``POST /nodes/{node}/decode``    DecodeCommand -> NDJSON stream of DecodeEvent (first line "ready")
``POST /nodes/{node}/abort/{id}`` cancel a running prefill of that request
``POST /nodes/{node}/role``      RoleCommand: drain, then switch role (the rebalancer's decision)
``POST /prefix/pull``, ``/prefix/push`` cross-site prefix moves (pull asks the source to push)
``POST /link/rate``              re-pace this site's inter-site link (emulation; 409 under netns)
``POST /notice``                 NoticeCommand: a spot notice (``serve/node/notice.py``): every node
                                 stops taking prefills, keeps those expected to end (prefill and
                                 KV stream) by ``deadline_s`` from now, hands the rest back
                                 (answered ``handed_back``: the gateway serves them elsewhere,
                                 a pool's front door queues them again for another node);
                                 a SIGTERM notice hands back any still running at its deadline
``GET  /health``                 this process's node reports (open: no ports in it)
``GET  /ready``                  200 once started while some node of this process is not draining
                                 for a role change; 503 otherwise (open: a readiness probe)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse, StreamingResponse

from prfaas.core import NodeRole
from prfaas.serve import internal_errors
from prfaas.serve.auth import Verifier
from prfaas.serve.auth_middleware import SignatureMiddleware
from prfaas.serve.control_tls import client_options, control_tls
from prfaas.serve.node.hosting import LinkRateRefused, LinkRateUnavailable, NodeHost, ServedNode
from prfaas.serve.node.messages import (
    DecodeCommand,
    LinkRateCommand,
    NoticeCommand,
    PrefillCommand,
    PrefillOutcome,
    PrefillStep,
    PrefixPullCommand,
    PrefixPushCommand,
    RoleCommand,
)
from prfaas.transfer import TransferError

DRAIN_POLL_S = 0.05
log = logging.getLogger("prfaas.node")


def create_node_app(host: NodeHost) -> FastAPI:
    running: dict[str, asyncio.Task[PrefillOutcome]] = {}
    handed_back: dict[str, str] = {}
    """Prefills a notice handed back, with why (their cancelled tasks answer so)."""
    desk = getattr(host, "notice", None)  # a worker host's; a vLLM sidecar takes no notice

    # Other workers' APIs (prefix moves): over HTTPS with ``tls.control_plane``.
    tls = client_options(control_tls(host.deployment))
    client = httpx.AsyncClient(timeout=30.0, auth=host.auth, trust_env=False, **tls)
    verifier = Verifier(host.auth.keys)  # one keyring with the signing half: one reload

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()
        await host.stop()

    app = FastAPI(
        title=f"prfaas node {host.process_name}",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    internal_errors.install(app)
    app.add_middleware(SignatureMiddleware, verifier=verifier, exempt=("/health", "/ready"))

    def node_or_404(name: str) -> ServedNode:
        node = host.nodes.get(name)
        if node is None:
            raise HTTPException(404, f"no node {name!r} in this process")
        return node

    def start_prefill(
        name: str, cmd: PrefillCommand, on_computed: Callable[[], None] | None = None
    ) -> asyncio.Task[PrefillOutcome]:
        """The prefill as a task an abort or a notice can cancel (``running`` until it ends)."""
        node = node_or_404(name)
        if node.role is not NodeRole.PREFILL or node.draining:
            raise HTTPException(409, f"node {name} is not accepting prefills")
        rid = cmd.request_id
        task = asyncio.create_task(host.prefill(name, cmd, on_computed))
        running[rid] = task

        def forget(t: asyncio.Task[PrefillOutcome]) -> None:
            if running.get(rid) is t:  # (a later prefill of the same id is not this one)
                del running[rid]

        task.add_done_callback(forget)
        return task

    async def outcome_of(task: asyncio.Task[PrefillOutcome], rid: str) -> PrefillOutcome:
        """The prefill's outcome; a cancelled one answers ``handed_back`` (a notice) or
        ``aborted``."""
        try:
            return await task
        except asyncio.CancelledError:
            if task.cancelled():
                why = handed_back.pop(rid, None)
                if why is not None:
                    return PrefillOutcome(request_id=rid, ok=False, error=why, handed_back=True)
                return PrefillOutcome(request_id=rid, ok=False, error="aborted")
            raise

    @app.post("/nodes/{name}/prefill")
    async def prefill(name: str, cmd: PrefillCommand) -> PrefillOutcome:
        return await outcome_of(start_prefill(name, cmd), cmd.request_id)

    @app.post("/nodes/{name}/prefill/stream")
    async def prefill_stream(name: str, cmd: PrefillCommand) -> StreamingResponse:
        """A pool's front door's prefill: ``PrefillStep`` lines, ``computed`` as soon as the
        node computed it and handed its KV to the link (the door places the node's next
        prefill then), then the ``outcome`` once the receiver verified the KV (or why not)."""
        computed = asyncio.Event()
        task = start_prefill(name, cmd, computed.set)

        async def lines() -> AsyncIterator[bytes]:
            waiter = asyncio.ensure_future(computed.wait())
            try:
                await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
            if computed.is_set():
                yield PrefillStep(kind="computed").model_dump_json().encode() + b"\n"
            # Waited on, not awaited: a caller that goes away (its stream cancelled) leaves the
            # prefill to end on its own, as a plain ``/prefill``'s does; only an abort stops it.
            await asyncio.wait((task,))
            outcome = await outcome_of(task, cmd.request_id)
            yield PrefillStep(kind="outcome", outcome=outcome).model_dump_json().encode() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    def begin_notice(deadline_in_s: float) -> dict[str, object]:
        """Stop taking prefills; keep what ends by the deadline, hand the rest back."""
        if desk is None:
            raise HTTPException(409, f"{host.process_name} cannot take a notice")
        for node in host.nodes.values():
            node.draining = True
        now = time.monotonic()
        plan = desk.notice(now, now + deadline_in_s)
        hand_back(
            plan.hand_back, f"got a notice ({deadline_in_s:g} s) and would not end it in time"
        )
        return {"deadline_in_s": deadline_in_s, "finish": list(plan.finish),
                "hand_back": list(plan.hand_back)}  # fmt: skip

    def hand_back(request_ids: tuple[str, ...], why: str) -> None:
        """Cancel these prefills; each answers ``handed_back`` with why."""
        for rid in request_ids:
            task = running.get(rid)
            if task is not None:
                handed_back[rid] = f"handed back: {host.process_name} {why}"
                task.cancel()

    def end_notice() -> None:
        """The notice's deadline: hand back what is still running (a kept one that ran late)."""
        if desk is not None:
            hand_back(desk.deadline_came(), "reached its notice's deadline before ending it")

    @app.post("/notice")
    async def notice(cmd: NoticeCommand) -> dict[str, object]:
        return begin_notice(cmd.deadline_s)

    @app.post("/nodes/{name}/abort/{request_id}")
    async def abort(name: str, request_id: str) -> dict[str, bool]:
        node_or_404(name)
        task = running.get(request_id)
        if task is not None:
            task.cancel()
        return {"aborted": task is not None}

    @app.post("/nodes/{name}/decode")
    async def decode(name: str, cmd: DecodeCommand) -> StreamingResponse:
        node = node_or_404(name)
        if node.role is not NodeRole.DECODE or node.draining:
            raise HTTPException(409, f"node {name} is not accepting decodes")
        if node.expects(cmd.request_id):
            raise HTTPException(409, f"request {cmd.request_id} is already expected here")

        async def lines() -> AsyncIterator[bytes]:
            async for event in node.decode(cmd):
                yield event.model_dump_json().encode() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/nodes/{name}/role")
    async def role(name: str, cmd: RoleCommand) -> dict[str, str]:
        node = node_or_404(name)
        wanted = NodeRole(cmd.role)
        if node.fixed_role and wanted is not node.role:
            raise HTTPException(409, f"node {name} at a PrfaaS site can only prefill")
        if wanted is node.role:
            return {"role": node.role.value}
        node.draining = True

        async def switch() -> None:
            while not node.idle:
                await asyncio.sleep(DRAIN_POLL_S)
            node.role = wanted
            node.draining = False

        host.spawn(switch())
        return {"role": node.role.value, "switching_to": wanted.value}

    @app.post("/prefix/pull")
    async def prefix_pull(cmd: PrefixPullCommand) -> dict[str, object]:
        try:
            num_tokens = await host.pull_prefix(cmd, client)
        except Exception as exc:  # the move is an optimisation: report, never crash
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "num_tokens": num_tokens}

    @app.post("/prefix/push")
    async def prefix_push(cmd: PrefixPushCommand) -> dict[str, int]:
        try:
            return {"num_tokens": await host.push_prefix(cmd)}
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None
        except (TransferError, OSError) as exc:
            raise HTTPException(502, f"push failed: {exc}") from None

    @app.post("/link/rate")
    async def link_rate(cmd: LinkRateCommand) -> dict[str, float]:
        """Shape this site's inter-site link (emulation without network namespaces)."""
        if host.link_gbps is None:
            raise HTTPException(409, f"site {host.site.name} sends nothing across sites")
        try:
            await host.set_link_gbps(cmd.gbps)
        except LinkRateRefused as exc:
            raise HTTPException(409, str(exc)) from None
        except LinkRateUnavailable as exc:
            raise HTTPException(503, str(exc)) from None
        return {"gbps": cmd.gbps}

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {
            "process": host.process_name,
            "nodes": [r.model_dump() for r in host.reports()],
            "auth_refused": verifier.num_refused,
            **host.health_details(),
        }

    @app.get("/ready")
    async def ready() -> JSONResponse:
        # The app serves only once the host has started (receiver listening, a vLLM server
        # up): ready means some node is not draining for a role change. Open like /health:
        # the kubelet's probe cannot sign; the answer names nodes only, never ports.
        taking = sorted(n for n, node in host.nodes.items() if not node.draining)
        status = 200 if taking else 503
        return JSONResponse({"ready": bool(taking), "nodes": taking}, status_code=status)

    app.state.host = host
    app.state.begin_notice = begin_notice
    app.state.end_notice = end_notice
    app.state.notice_desk = desk
    return app
