"""What the node HTTP API (``serve/node/app.py``) needs of a node process, whatever runs its
nodes: ``NodeHost`` (``WorkerHost``: prfaas engines with their own KV receiver and senders;
``serve.vllm.host.VllmHost``: a vLLM server driven by a sidecar) and ``ServedNode``. Must not
import either host.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, Protocol

import httpx

from prfaas.config import DeploymentConfig, SiteConfig
from prfaas.core import NodeRole
from prfaas.serve.auth import SignedAuth
from prfaas.serve.node.messages import (
    DecodeCommand,
    DecodeEvent,
    NodeReport,
    PrefillCommand,
    PrefillOutcome,
    PrefixPullCommand,
    PrefixPushCommand,
    Registration,
)


class LinkRateRefused(Exception):
    """``/link/rate`` cannot shape this site's link at all (409; the message says why)."""


class LinkRateUnavailable(Exception):
    """``/link/rate`` cannot be applied now: what paces the link cannot be asked (503)."""


class ServedNode(Protocol):
    role: NodeRole
    draining: bool

    @property
    def fixed_role(self) -> bool:
        """A PrfaaS site's node: prefill only."""
        ...

    @property
    def idle(self) -> bool:
        """Nothing queued, computing or decoding here: safe to change role."""
        ...

    def expects(self, request_id: str) -> bool: ...

    def decode(self, cmd: DecodeCommand) -> AsyncIterator[DecodeEvent]: ...


class NodeHost(Protocol):
    @property
    def deployment(self) -> DeploymentConfig: ...

    @property
    def site(self) -> SiteConfig: ...

    @property
    def process_name(self) -> str: ...

    @property
    def control_url(self) -> str: ...

    @property
    def auth(self) -> SignedAuth:
        """Signs this process's calls (to the gateway and to other workers)."""
        ...

    @property
    def nodes(self) -> Mapping[str, ServedNode]: ...

    @property
    def link_gbps(self) -> float | None:
        """The inter-site link this process paces (None: ``/link/rate`` is refused)."""
        ...

    async def prefill(
        self, name: str, cmd: PrefillCommand, on_computed: Callable[[], None] | None = None
    ) -> PrefillOutcome:
        """Node ``name`` prefills ``cmd`` (cancel it to abort); failures come back as
        ``ok=False``. ``on_computed``: called once its compute is done and its KV all handed to
        the link, before the receiver verifies it (a host that cannot tell never calls it)."""
        ...

    async def pull_prefix(self, cmd: PrefixPullCommand, client: httpx.AsyncClient) -> int: ...

    async def push_prefix(self, cmd: PrefixPushCommand) -> int:
        """``LookupError``: no such prefix here."""
        ...

    async def set_link_gbps(self, gbps: float) -> None:
        """Pace this site's cross-site sends at ``gbps`` (modelled) from now on; the capacity
        estimate starts afresh. ``LinkRateRefused``: nothing here paces the link (netns: tbf
        shapes it); ``LinkRateUnavailable``: the pacer cannot be reached now (a vLLM server
        down)."""
        ...

    def registration(self) -> Registration: ...

    def reports(self) -> list[NodeReport]: ...

    def health_details(self) -> dict[str, object]:
        """More for ``/health`` (open: nothing secret, no ports)."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    async def start(self, http_port: int) -> None:
        """Start serving (the node API listens on ``http_port``) and register."""
        ...

    async def stop(self) -> None: ...
