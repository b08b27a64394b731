"""The control plane over TLS (``tls.control_plane: true``), on loopback with a certificate made at
test time: one server serves the control port over HTTPS and the client port in plain HTTP; a
signed call over TLS is answered, a plain-HTTP one on the TLS port is refused (the connection cut),
a client without the deployment's CA, or checking another name, refuses the listener. Then a whole
deployment of ``prfaas serve`` processes with it on: the nodes register and heartbeat over HTTPS,
the gateway calls them over HTTPS (a request served through both routes), ``prfaas status``'s
client reads the control listener, and plain HTTP to the control port or a node's API is refused."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from control_helpers import PSK, cluster, deployment_dict
from fastapi import FastAPI, Request

from prfaas.config import DeploymentConfig, TLSConfig
from prfaas.serve.auth import SignedAuth, Verifier
from prfaas.serve.auth_middleware import SignatureMiddleware
from prfaas.serve.control_client import ControlClient
from prfaas.serve.control_tls import ControlTLS, tls_contexts
from prfaas.serve.listeners import PortRouter, bind, server_for
from transfer_helpers import self_signed_cert

pytestmark = pytest.mark.timeout(120)


def _cert(tmp: Path) -> tuple[Path, Path]:
    files = self_signed_cert(tmp)
    if files is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    return files


def _control_tls(tmp: Path) -> ControlTLS:
    cert, key = _cert(tmp)
    server, client = tls_contexts(TLSConfig(cert=str(cert), key=str(key), ca=str(cert)))
    return ControlTLS(server, client, "localhost")


def _app(name: str) -> FastAPI:
    app = FastAPI()

    @app.get("/who")
    async def who() -> dict[str, str]:
        return {"app": name}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    return app


@asynccontextmanager
async def _gateway_like(tls: ControlTLS) -> AsyncIterator[tuple[int, int]]:
    """A client port (plain) and a signed control port (TLS) in one server, as the gateway's."""
    client_sock, control_sock = bind("127.0.0.1", 0), bind("127.0.0.1", 0)
    client_port, control_port = client_sock.getsockname()[1], control_sock.getsockname()[1]
    control = SignatureMiddleware(_app("control"), Verifier(PSK.encode()))
    router = PortRouter(_app("client"), {control_port: control})
    server = server_for(router, head_timeout_s=2.0, tls={control_port: tls.server})
    task = asyncio.create_task(server.serve(sockets=[client_sock, control_sock]))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        yield client_port, control_port
    finally:
        server.should_exit = True
        await task


async def test_signed_calls_cross_tls_and_plain_http_is_refused(tmp_path: Path) -> None:
    tls = _control_tls(tmp_path)
    auth = SignedAuth(PSK.encode())
    async with _gateway_like(tls) as (client_port, control_port):
        control = f"127.0.0.1:{control_port}"
        async with httpx.AsyncClient(auth=auth, timeout=5, **tls.client_options()) as http:
            who = await http.get(f"https://{control}/who")
            echo = await http.post(f"https://{control}/echo", content=b"x" * 100_000)
            with pytest.raises(httpx.HTTPError):  # no TLS ClientHello: the handshake fails
                await http.get(f"http://{control}/who")
        assert who.status_code == 200 and who.json() == {"app": "control"}
        assert echo.status_code == 200 and echo.json() == {"bytes": 100_000}
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:  # clients never sign
            plain_client_port = await http.get(f"http://127.0.0.1:{client_port}/who")
        assert plain_client_port.json() == {"app": "client"}
        # Without the deployment's CA, or checking another name, the listener is not trusted.
        async with httpx.AsyncClient(auth=auth, timeout=5, trust_env=False) as http:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get(f"https://{control}/who")
        other = dataclasses.replace(tls, server_hostname="not-the-name.example")
        async with httpx.AsyncClient(auth=auth, timeout=5, **other.client_options()) as http:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get(f"https://{control}/who")


@pytest.mark.timeout(180)
def test_a_deployment_runs_its_control_plane_over_tls(tmp_path: Path) -> None:
    cert, key = _cert(tmp_path)
    config = deployment_dict()
    config["tls"] = {"cert": str(cert), "key": str(key), "ca": str(cert), "control_plane": True}
    # The nodes are in rotation once ``cluster`` returns: registered and heartbeating over HTTPS.
    with cluster(tmp_path, config) as c:
        assert c.control_url.startswith("https://")
        for prompt in ("a" * 200, "b" * 20_000):  # local, then offloaded to the PrfaaS site
            body = {"model": "paper-1t", "prompt": prompt, "max_tokens": 8}
            r = httpx.post(f"{c.url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
        with ControlClient(DeploymentConfig.model_validate(config)) as status:
            assert status.url == c.control_url
            assert [r["offloaded"] for r in status.routes()] == [False, True]
        node_url = c.node_url("d0")
        assert node_url.startswith("https://")
        with c.signed() as signed:
            assert signed.get(f"{node_url}/health").status_code == 200
        plain = httpx.Client(auth=SignedAuth(PSK.encode()), timeout=5.0, trust_env=False)
        with plain:
            for url in (c.control_url, node_url):
                with pytest.raises(httpx.HTTPError):
                    plain.get(url.replace("https://", "http://", 1) + "/internal/nodes")
