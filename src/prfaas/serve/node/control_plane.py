"""What a node process does the same whatever runs its nodes (``serve.node.host.WorkerHost``:
prfaas engines; ``serve.vllm.host.VllmHost``: a vLLM server): the checks on the nodes it is given
(at least one, all of one site), its default name, its registration's endpoints, the
control-plane loop (register, heartbeat, re-register when the gateway forgot us) and its
background tasks. Each host keeps what differs: its reports, what a heartbeat carries besides
them and what it does with the answer. Must not import either host (both import this), an engine
or vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, Protocol

import httpx

from prfaas.config import DeploymentConfig, SiteConfig
from prfaas.core import NodeRole
from prfaas.serve.control_tls import ControlTLS, client_options
from prfaas.serve.node.messages import Heartbeat, NodeEndpoint, NodeReport, Registration
from prfaas.transfer.frames import MAX_NAME_BYTES

MAX_PROCESS_NAME_BYTES = MAX_NAME_BYTES
"""The transfer handshake carries the process name."""


def default_process_name(node_names: Sequence[str]) -> str:
    """The nodes' names joined by "+" (stable across restarts: the gateway keys processes by it);
    a long list is cut and keeps a digest of the whole, so it stays unique and within the
    transfer handshake's limit (a site of 12 emulated nodes overflowed it)."""
    joined = "+".join(node_names)
    if len(joined.encode()) <= MAX_PROCESS_NAME_BYTES:
        return joined
    digest = hashlib.sha256(joined.encode()).hexdigest()[:10]
    head = joined.encode()[: MAX_PROCESS_NAME_BYTES - len(digest) - 1].decode(errors="ignore")
    return f"{head}~{digest}"


def site_of_nodes(deployment: DeploymentConfig, node_names: Sequence[str], what: str) -> SiteConfig:
    """The one site a process hosting ``node_names`` serves; ``ValueError`` when there are no
    nodes or they belong to several sites (``what`` names the process in the message)."""
    if not node_names:
        raise ValueError(f"a {what} hosts at least one node")
    sites = {deployment.site_of(n).name for n in node_names}
    if len(sites) != 1:
        raise ValueError(f"one {what} hosts nodes of one site, got {sorted(sites)}")
    return deployment.site_of(node_names[0])


class HostedNode(Protocol):
    """What a registration says of a node (``worker.Node`` and ``vllm.node.VllmNode``)."""

    @property
    def name(self) -> str: ...

    @property
    def site(self) -> str: ...

    @property
    def role(self) -> NodeRole: ...


def registration(
    process: str,
    nodes: Iterable[HostedNode],
    host: str,
    http_port: int,
    transfer_port: int,
    reports: Sequence[NodeReport] = (),
) -> Registration:
    """The process's nodes, all reached at one host, node API port and transfer port."""
    return Registration(
        process=process,
        reports=list(reports),
        nodes=[
            NodeEndpoint(
                node=n.name,
                site=n.site,
                role=n.role.value,
                host=host,
                http_port=http_port,
                transfer_port=transfer_port,
            )
            for n in nodes
        ],
    )


def _ignore_answer(r: httpx.Response) -> None:
    del r


async def run_control_plane(
    url: str,
    auth: httpx.Auth,
    interval_s: float,
    log: logging.Logger,
    registration: Callable[[], Registration],
    heartbeat: Callable[[], Heartbeat],
    on_registered: Callable[[], None] = lambda: None,
    on_heartbeat_answer: Callable[[httpx.Response], None] = _ignore_answer,
    tls: ControlTLS | None = None,
) -> None:
    """Register (retrying until the gateway answers), then heartbeat every ``interval_s``;
    re-register when the gateway forgot us (it answers 404 to a heartbeat from an unknown
    process). A refusal (401: another key) is logged at WARNING each time it starts; the
    callbacks see only the 200 answers. ``tls``: the control plane's, with
    ``tls.control_plane`` (``url`` is then https). Runs until cancelled."""
    registered = False
    refused = ""
    options = client_options(tls)
    async with httpx.AsyncClient(timeout=5.0, auth=auth, trust_env=False, **options) as client:
        while True:
            try:
                if not registered:
                    body = registration().model_dump()
                    r = await client.post(f"{url}/internal/register", json=body)
                    if r.status_code == 200:
                        on_registered()
                else:
                    beat = heartbeat().model_dump()
                    r = await client.post(f"{url}/internal/heartbeat", json=beat)
                    if r.status_code == 200:
                        on_heartbeat_answer(r)
                registered = r.status_code == 200
                why = "" if r.status_code in (200, 404) else f"{r.status_code} {r.text[:200]}"
                if why and why != refused:
                    log.warning("gateway %s refused us: %s", url, why)
                refused = why
            except httpx.HTTPError as exc:
                log.debug("control plane: %s", exc)
                registered = False
            await asyncio.sleep(interval_s)


class BackgroundTasks:
    """A process's background tasks: each is forgotten when it ends; ``stop`` cancels the ones
    left and waits for them (whatever they raise)."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def join(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def stop(self) -> None:
        self.cancel()
        await self.join()
