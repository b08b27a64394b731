"""TLS from the deployment's ``tls:`` section: the contexts of the KV links, and, with
``tls.control_plane: true``, the control plane's (the gateway's control port, every worker API)
and what every internal client of it verifies with.

What each layer protects (``docs/live.md``): signed calls and answer MACs (``serve.auth``,
``serve.answer_auth``) give integrity and freshness with or without TLS; TLS adds
confidentiality (prompts' token ids and generated tokens are no longer readable on the wire).

Clients check the listener's certificate against ``tls.ca`` under ``tls.server_hostname`` (the
name the certificate is issued to, as the KV senders do), not under the URL's host: nodes are
reached by address, and one certificate serves them all. httpx takes that name per request (its
``sni_hostname`` extension), which a request hook sets on every call.

Owns no connection. Imports ssl, httpx and the config; nothing of ``serve`` below it.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import httpx

from prfaas.config import DeploymentConfig, TLSConfig


def tls_contexts(tls: TLSConfig) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Fresh (server, client) contexts from the section's files: the server presents ``cert``,
    the client verifies against ``ca``. Fresh each call: httpx sets ALPN on a client context it
    is given, so the control plane's and the KV links' are never the same object."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tls.cert, tls.key)
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca)
    return server, client


@dataclass(frozen=True, slots=True)
class ControlTLS:
    """The control plane's TLS in one process."""

    server: ssl.SSLContext
    """What this process's control listener (gateway) or worker API (node) serves with."""
    client: ssl.SSLContext
    """What its clients verify the other processes' listeners with."""
    server_hostname: str
    """The name their certificate is checked against (``tls.server_hostname``)."""

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for an ``httpx.AsyncClient`` of the control plane."""
        name = self.server_hostname

        async def named(request: httpx.Request) -> None:
            request.extensions["sni_hostname"] = name

        return {"verify": self.client, "event_hooks": {"request": [named]}}

    def sync_client_options(self) -> dict[str, Any]:
        """Keyword arguments for an ``httpx.Client`` of the control plane."""
        name = self.server_hostname

        def named(request: httpx.Request) -> None:
            request.extensions["sni_hostname"] = name

        return {"verify": self.client, "event_hooks": {"request": [named]}}


def control_tls(d: DeploymentConfig) -> ControlTLS | None:
    """The control plane's TLS, or None when ``tls.control_plane`` is off (plain HTTP)."""
    if d.tls is None or not d.tls.control_plane:
        return None
    server, client = tls_contexts(d.tls)
    return ControlTLS(server, client, d.tls.server_hostname)


def client_options(tls: ControlTLS | None) -> dict[str, Any]:
    """``ControlTLS.client_options``, or nothing (plain HTTP) without TLS."""
    return {} if tls is None else tls.client_options()


def sync_client_options(tls: ControlTLS | None) -> dict[str, Any]:
    """``ControlTLS.sync_client_options``, or nothing (plain HTTP) without TLS."""
    return {} if tls is None else tls.sync_client_options()


def scheme(tls: ControlTLS | None) -> str:
    return "http" if tls is None else "https"
