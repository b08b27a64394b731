"""Fixtures for the gateway HTTP tests (servers started per module, stopped even on failure)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serve_api_fakes import Server, serve

from prfaas.serve.api import GatewayHTTPConfig


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serve(GatewayHTTPConfig(request_timeout_s=2.0, default_max_tokens=16))


@pytest.fixture(scope="module")
def tiny_server() -> Iterator[Server]:
    """One slot, one queue place: the third concurrent request is refused."""
    yield from serve(
        GatewayHTTPConfig(
            max_in_flight=1, max_queued=1, queue_timeout_s=5.0, retry_after_s=3, max_body_bytes=4096
        )
    )
