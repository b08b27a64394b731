"""``ControlClient`` reads again once when the gateway closed a kept-alive connection as it was
reused (httpx: "Server disconnected without sending a response"); it never sends a change twice."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from prfaas.config import load_deployment
from prfaas.serve.control_client import ControlClient, GatewayUnreachable

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "two-site.yaml"


def _client(failures: int, seen: list[str]) -> ControlClient:
    """A client whose transport drops the first ``failures`` requests unanswered."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if len(seen) <= failures:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, json=[{"node": "p0"}])

    client = ControlClient(load_deployment(EXAMPLE))
    client._http = httpx.Client(transport=httpx.MockTransport(handler))
    return client


def test_a_read_goes_again_once_on_a_fresh_connection() -> None:
    seen: list[str] = []
    assert _client(1, seen).nodes() == [{"node": "p0"}]
    assert seen == ["GET /internal/nodes"] * 2


def test_a_gateway_that_keeps_hanging_up_is_unreachable() -> None:
    seen: list[str] = []
    with pytest.raises(GatewayUnreachable, match="Server disconnected"):
        _client(2, seen).nodes()
    assert len(seen) == 2


def test_a_change_is_not_sent_twice() -> None:
    seen: list[str] = []
    client = _client(1, seen)
    with pytest.raises(GatewayUnreachable):
        client._call("POST", "/internal/drain/p0")
    assert seen == ["POST /internal/drain/p0"]
