"""The HTTP listeners of every process: uvicorn (h11) with a request-head timeout, and one server
on several sockets with requests routed by the local port they arrived on.

uvicorn has no header timeout: a connection that sends half a request line, or nothing, is kept
forever (its keep-alive timer only runs after a response). ``HeadTimeoutProtocol`` cuts a
connection whose request head (request line + headers) has not fully arrived ``head_timeout_s``
after the connection opened or the previous response ended; once the head is in, a slow body or a
long response is not limited here (the apps have their own deadlines).

``PortRouter`` lets the gateway serve its client app and its control app from one uvicorn server
(one event loop, one set of signal handlers, one graceful shutdown): uvicorn puts the socket's
local address in ``scope["server"]``; a request that arrived on the control port goes to the
control app, everything else to the client app; lifespan events go to the client app only (the
control app keeps no state of its own).

``UnverifiedConnections`` is the quota of connections that have not yet made a verified (signed)
call, on the ports it guards (a node's port, the gateway's control port; not the gateway's client
port): at most ``max_unverified`` of them, and when one more arrives the *oldest* is cut. A flood of
idle, slow or forged connections then costs at most ``max_unverified`` x (h11's 16 KiB head limit
+ uvicorn's 64 KiB read buffer) of memory and never the connections of registered nodes, which
verified on their first call and keep-alive; a fresh legitimate connection sends its signed head
at once and verifies long before it becomes the oldest. The signature check itself
(``serve.auth_middleware``) tells the connection it verified.

``serve(..., tls=...)`` serves the sockets it names over TLS (the control plane's, from
``tls.control_plane``: ``serve.control_tls``) and the others in plain HTTP, from one server: uvicorn
gives every socket the one context of its config, so ``_Server`` creates the TLS sockets' listeners
itself, with the same protocol factory. Their TLS handshake must end within the head timeout;
only then does the connection enter the quota and its head timer start.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from prfaas.serve.auth_middleware import CONNECTION_EXTENSION

HEAD_TIMEOUT_S = 10.0
MAX_UNVERIFIED = 64
"""Connections at once that have not made a verified call, per listening server."""
log = logging.getLogger("prfaas.serve")


class UnverifiedConnections:
    """The quota of connections (on ``ports``; None: every port) without a verified call yet."""

    def __init__(self, max_unverified: int = MAX_UNVERIFIED, ports: Collection[int] | None = None):
        if max_unverified < 1:
            raise ValueError(f"max_unverified={max_unverified} must be >= 1")
        self.max_unverified = max_unverified
        self.ports = None if ports is None else frozenset(ports)
        self._held: dict[HeadTimeoutProtocol, None] = {}  # insertion order: oldest first
        self.num_cut = 0
        """Connections cut to make room (the oldest unverified one each time)."""

    def __len__(self) -> int:
        return len(self._held)

    def guards(self, port: int | None) -> bool:
        return self.ports is None or port in self.ports

    def admit(self, conn: HeadTimeoutProtocol) -> None:
        self._held[conn] = None
        while len(self._held) > self.max_unverified:
            oldest = next(iter(self._held))
            del self._held[oldest]
            self.num_cut += 1
            if self.num_cut & (self.num_cut - 1) == 0:  # 1st, 2nd, 4th...: a flood can't fill logs
                log.warning(
                    "over %d unverified connections: cut the oldest, %s (%d cut so far)",
                    self.max_unverified, oldest.client, self.num_cut,
                )  # fmt: skip
            oldest.transport.close()

    def release(self, conn: HeadTimeoutProtocol) -> None:
        self._held.pop(conn, None)


class _Handle:
    """What the signature check sees of a connection (``scope["extensions"]``)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: HeadTimeoutProtocol) -> None:
        self._conn = conn

    def verified(self) -> None:
        quota = self._conn.unverified
        if quota is not None:
            quota.release(self._conn)


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline on each request head."""

    head_timeout_s = HEAD_TIMEOUT_S
    unverified: UnverifiedConnections | None = None
    num_cut = 0
    """Connections cut for a slow head, in this process (all listeners)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        inner, handle = self.app, _Handle(self)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            scope.setdefault("extensions", {})[CONNECTION_EXTENSION] = handle
            await inner(scope, receive, send)

        self.app = app

    # uvicorn's H11Protocol narrows BaseProtocol's BaseTransport to Transport; so does this one.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        quota = self.unverified
        if quota is not None and quota.guards(_local_port(transport)):
            quota.admit(self)
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        if self.unverified is not None:
            self.unverified.release(self)
        super().connection_lost(exc)

    def _watch_head(self) -> None:
        # h11 leaves IDLE for the client once a whole request head has been parsed (a pipelined
        # request parsed from the buffer included).
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not waiting:
            self._stop_head_timer()
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            HeadTimeoutProtocol.num_cut += 1  # one count for every subclass
            log.debug("cut %s: no complete request head in %g s", self.client, self.head_timeout_s)
            self.transport.close()


def _local_port(transport: asyncio.Transport) -> int | None:
    name = transport.get_extra_info("sockname")
    return int(name[1]) if isinstance(name, tuple) and len(name) > 1 else None


def protocol_with_head_timeout(
    head_timeout_s: float, unverified: UnverifiedConnections | None = None
) -> type[HeadTimeoutProtocol]:
    if head_timeout_s <= 0:
        raise ValueError(f"head_timeout_s={head_timeout_s} must be positive")
    attrs = {"head_timeout_s": head_timeout_s, "unverified": unverified}
    return type("HeadTimeoutProtocol", (HeadTimeoutProtocol,), attrs)


class PortRouter:
    """ASGI app: requests by local port to ``by_port``'s app, others (and lifespan) to
    ``default``."""

    def __init__(self, default: Any, by_port: Mapping[int, Any]) -> None:
        self.default = default
        self.by_port = dict(by_port)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = self.default
        server = scope.get("server")
        if scope["type"] != "lifespan" and server is not None and len(server) > 1:
            app = self.by_port.get(server[1], self.default)
        await app(scope, receive, send)


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit it: without it, a response written in two parts waits for the
    # peer's delayed ACK (40 ms on Linux) on every keep-alive request.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server with a TLS context per socket (``tls``: by local port), whose first
    SIGTERM may be taken as a spot notice (``on_sigterm`` returns True): the process then ends
    when the notice says, not at once."""

    on_sigterm: Callable[[], bool] | None = None

    def __init__(
        self, config: uvicorn.Config, tls: Mapping[int, ssl.SSLContext], handshake_s: float
    ) -> None:
        super().__init__(config)
        self.tls = dict(tls)
        self.handshake_s = handshake_s

    def handle_exit(self, sig: int, frame: Any) -> None:
        on_sigterm, self.on_sigterm = self.on_sigterm, None  # a second SIGTERM stops now
        if sig == signal.SIGTERM and on_sigterm is not None and on_sigterm():
            return
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        socks = list(sockets or [])
        secure = [s for s in socks if _sock_port(s) in self.tls]
        await super().startup(sockets=[s for s in socks if s not in secure])
        if not secure:
            return
        loop = asyncio.get_running_loop()
        config = self.config

        def create_protocol() -> asyncio.Protocol:  # as uvicorn's own startup builds it
            protocol: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
                _loop=loop,
            )
            return protocol

        for sock in secure:
            server = await loop.create_server(
                create_protocol,
                sock=sock,
                ssl=self.tls[_sock_port(sock)],
                ssl_handshake_timeout=self.handshake_s,
                backlog=config.backlog,
            )
            self.servers.append(server)


def _sock_port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def server_for(
    app: Any,
    head_timeout_s: float = HEAD_TIMEOUT_S,
    unverified: UnverifiedConnections | None = None,
    tls: Mapping[int, ssl.SSLContext] | None = None,
) -> _Server:
    """``tls``: the local ports served over TLS, with their server contexts (the rest plain)."""
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,
        http=protocol_with_head_timeout(head_timeout_s, unverified),
    )
    return _Server(config, tls or {}, head_timeout_s)


async def serve(
    app: Any,
    sockets: Sequence[socket.socket],
    head_timeout_s: float = HEAD_TIMEOUT_S,
    unverified: UnverifiedConnections | None = None,
    tls: Mapping[int, ssl.SSLContext] | None = None,
    on_sigterm: Callable[[uvicorn.Server], bool] | None = None,
) -> None:
    """``unverified``: the quota of connections without a verified call; ``tls``: the local
    ports served over TLS, with their contexts (see the module); ``on_sigterm(server)``: called
    on the first SIGTERM (in the signal handler: schedule, do not work); True when it took the
    signal (it sets ``server.should_exit`` itself later)."""
    server = server_for(app, head_timeout_s, unverified, tls)
    if on_sigterm is not None:
        server.on_sigterm = lambda: on_sigterm(server)
    await server.serve(sockets=list(sockets))
