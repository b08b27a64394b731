"""Property: no body a client can send makes the gateway answer 5xx (with the fake backend, which
never fails unless asked by a marker), every 4xx has an OpenAI-style error body, and nothing is
left held afterwards. Bodies are valid requests with fields overwritten by arbitrary JSON (huge
numbers, NaN, lone surrogates, nesting, wrong types), plus arbitrary bytes. In process (ASGI), no
sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_api_fakes import MODEL, FakeBackend

from prfaas.serve.api import ByteTokenizer, GatewayHTTPConfig, create_gateway_app
from prfaas.serve.api.schemas import (
    CHAT_RULES,
    COMPLETION_RULES,
    HONOURED_CHAT,
    HONOURED_COMPLETION,
)

pytestmark = pytest.mark.timeout(120)

PATHS = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
FIELDS = sorted(
    {*HONOURED_COMPLETION, *HONOURED_CHAT, *COMPLETION_RULES, *CHAT_RULES, "tokens", "prompt"}
)
BASES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"model": MODEL, "prompt": "fuzz", "max_tokens": 3},
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "f"}]},
    "/tokenize": {"prompt": "fuzz"},
    "/detokenize": {"tokens": [102, 117]},
}

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, 10**30, -(10**30), 10**4000]),
    st.floats(),  # NaN and infinities included: json.dumps writes NaN / Infinity
    st.text(max_size=12),
    st.sampled_from(["\ud800", "a\udfffb", "text", "user", "assistant", MODEL]),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
_messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant", "tool", "bot"]),
            "content": st.text(max_size=20) | _json,
        }
    ),
    max_size=3,
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(PATHS))
    if draw(st.integers(0, 9)) == 0:
        return path, draw(st.binary(max_size=64))
    body = dict(BASES[path])
    body.update(draw(st.dictionaries(st.sampled_from(FIELDS), _json, max_size=4)))
    if draw(st.booleans()):
        body["messages"] = draw(_messages)
    if draw(st.integers(0, 4)) == 0:
        body[draw(st.text(max_size=8))] = draw(_json)
    return path, json.dumps(body).encode()


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[asyncio.AbstractEventLoop, httpx.AsyncClient, Any, FakeBackend]]:
    backend = FakeBackend()
    config = GatewayHTTPConfig(request_timeout_s=5.0, default_max_tokens=8)
    app = create_gateway_app(backend, ByteTokenizer(), config)
    loop = asyncio.new_event_loop()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    try:
        yield loop, client, app, backend
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request=requests())
def test_no_body_makes_a_server_error(
    gateway: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient, Any, FakeBackend],
    request: tuple[str, bytes],
) -> None:
    loop, client, app, backend = gateway
    path, content = request
    headers = {"content-type": "application/json"}
    resp = loop.run_until_complete(client.post(path, content=content, headers=headers))
    assert resp.status_code < 500, (path, content[:300], resp.text[:300])
    if resp.status_code >= 400:
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert isinstance(error["message"], str) and error["message"]
    admission = app.state.gateway.admission
    assert (admission.num_in_flight, admission.num_queued, backend.open_generators) == (0, 0, 0)
