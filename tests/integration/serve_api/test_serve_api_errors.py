"""Bad input gets a 4xx with an OpenAI-style error body (never a 500 or a hung stream); backend
failures keep their status, or end a started stream with an error event."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import openai
import pytest
from serve_api_fakes import MAX_CONTEXT_TOKENS, MODEL, Server

pytestmark = pytest.mark.timeout(30)

OK = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def post(server: Server, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(server.url + path, timeout=10, **kwargs)


def assert_error(
    resp: httpx.Response, status: int, code: str | None = None, param: Any = ...
) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code, error
    if param is not ...:
        assert error["param"] == param, error


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("change", "status", "code", "param"),
    [
        ({"model": "gpt-nope"}, 404, "model_not_found", "model"),
        ({"prompt": ""}, 400, "empty_prompt", "prompt"),
        ({"prompt": []}, 400, "empty_prompt", "prompt"),
        ({"max_tokens": 0}, 400, None, "max_tokens"),
        ({"max_tokens": -3}, 400, None, "max_tokens"),
        ({"max_tokens": MAX_CONTEXT_TOKENS}, 400, "context_length_exceeded", "max_tokens"),
        ({"prompt": "a" * MAX_CONTEXT_TOKENS}, 400, "context_length_exceeded", "prompt"),
        ({"prompt": [1] * (MAX_CONTEXT_TOKENS + 5)}, 400, "context_length_exceeded", "prompt"),
        ({"temperature": "hot"}, 400, None, "temperature"),
        ({"temperature": 9.0}, 400, None, "temperature"),
        ({"top_p": 0}, 400, None, "top_p"),
        ({"max_tokens": "10"}, 400, None, "max_tokens"),
        ({"max_tokens": 2.5}, 400, None, "max_tokens"),
        ({"prompt": 5}, 400, None, "prompt"),
        ({"prompt": ["a", "b"]}, 400, None, None),
        ({"prompt": [1, -2]}, 400, None, "prompt.1"),
        ({"prompt": [300]}, 400, None, "prompt.0"),
        ({"prompt": [[1], [2]]}, 400, None, "prompt"),
        ({"n": 2}, 400, "unsupported_value", "n"),
        ({"n": True}, 400, "unsupported_value", "n"),
        ({"best_of": 3}, 400, "unsupported_value", "best_of"),
        ({"stop": ["\n"]}, 400, "unsupported_value", "stop"),
        ({"seed": "x"}, 400, None, "seed"),
        ({"seed": 10**30}, 400, None, "seed"),
        ({"seed": -1}, 400, None, "seed"),
        ({"presence_penalty": 0.5}, 400, "unsupported_value", "presence_penalty"),
        ({"frequency_penalty": 0.5}, 400, "unsupported_value", "frequency_penalty"),
        ({"logprobs": 5}, 400, "unsupported_value", "logprobs"),
        ({"logprobs": 0}, 400, "unsupported_value", "logprobs"),
        ({"echo": True}, 400, "unsupported_value", "echo"),
        ({"suffix": "x"}, 400, "unsupported_value", "suffix"),
        ({"logit_bias": {"5": 10}}, 400, "unsupported_value", "logit_bias"),
        ({"min_p": 0.1}, 400, "unsupported_value", "min_p"),
        ({"skip_special_tokens": False}, 400, "unsupported_value", "skip_special_tokens"),
        ({"response_format": {"type": "json_object"}}, 400, None, "response_format"),
        ({"guided_json": {}}, 400, "unsupported_value", "guided_json"),
        ({"user": 5}, 400, "type_error", "user"),
        ({"temperature": -0.1}, 400, None, "temperature"),
        ({"temperature": True}, 400, None, "temperature"),
        ({"top_p": 1.5}, 400, None, "top_p"),
        ({"top_k": -2}, 400, None, "top_k"),
        ({"top_k": 2**40}, 400, None, "top_k"),
        ({"top_k": 1.5}, 400, None, "top_k"),
        ({"repetition_penalty": 0}, 400, None, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, 400, None, "repetition_penalty"),
        ({"repetition_penalty": "1"}, 400, None, "repetition_penalty"),
        ({"min_tokens": 5}, 400, None, "min_tokens"),  # max_tokens is 4
        ({"min_tokens": -1}, 400, None, "min_tokens"),
        ({"ignore_eos": "yes"}, 400, None, "ignore_eos"),
        ({"stop_token_ids": [300]}, 400, None, "stop_token_ids.0"),
        ({"stop_token_ids": [1.5]}, 400, None, "stop_token_ids.0"),
        ({"stream_options": {"include_usage": "x"}}, 400, None, "stream_options.include_usage"),
        ({"max_completion_tokens": 0}, 400, None, "max_completion_tokens"),
        ({"model": None}, 400, None, "model"),
    ],
)
def test_bad_completion_request(
    server: Server, stream: bool, change: dict[str, Any], status: int, code: str | None, param: Any
) -> None:
    body = {**OK, "stream": stream, **change}
    before = len(server.backend.started)
    resp = post(server, "/v1/completions", json=body)
    if param is None:
        assert_error(resp, status, code)
    else:
        assert_error(resp, status, code, param)
    assert len(server.backend.started) == before  # refused before the backend


@pytest.mark.parametrize(
    ("change", "status", "param"),
    [
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "user", "content": ""}]}, 400, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
        ({"messages": "hi"}, 400, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, None),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
        ({"model": "other"}, 404, "model"),
        ({"stream_options": {"include_usage": True}}, 400, "stream_options"),
        ({"logprobs": True}, 400, "logprobs"),
        ({"top_logprobs": 3}, 400, "top_logprobs"),
        ({"tools": [{"type": "function"}]}, 400, "tools"),
        ({"tool_choice": "required"}, 400, "tool_choice"),
        ({"response_format": {"type": "json_schema"}}, 400, "response_format"),
        ({"add_generation_prompt": "no"}, 400, "add_generation_prompt"),
    ],
)
def test_bad_chat_request(
    server: Server, change: dict[str, Any], status: int, param: str | None
) -> None:
    resp = post(server, "/v1/chat/completions", json={**OK_CHAT, **change})
    if param is None:
        assert_error(resp, status)
    else:
        assert_error(resp, status, None, param)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"",
        b"[1, 2]",
        b'"text"',
        b"\xff\xfe",
        b'{"model": "fake-model", "prompt": "a",',
        b'{"model": "fake-model", "prompt": "a", "temperature": NaN}',
        b'{"model": "fake-model", "prompt": "a", "top_p": -Infinity}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        b'{"model": "fake-model", "prompt": "a", "x": ' + b"[" * 500 + b"]" * 500 + b"}",
        b'{"model": "fake-model", "prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}",
        b'{"model": "fake-model", "prompt": "\\ud800"}',
        b'{"model": "fake-model", "prompt": "ok \\udfff then"}',
        b'{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud83d"}]}',
        b'{"model": "fake-model", "prompt": "a", "\\udc00": 1}',
        '{"model": "fake-model", "prompt": "a"}'.encode("utf-16"),
        b"null",
        b"1e999",
    ],
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_malformed_json(server: Server, content: bytes, path: str) -> None:
    resp = post(server, path, content=content, headers={"content-type": "application/json"})
    assert_error(resp, 400)


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty"])
def test_infinite_number_names_the_field(server: Server, field: str) -> None:
    content = b'{"model": "fake-model", "prompt": "a", "%s": 1e999}' % field.encode()
    assert_error(post(server, "/v1/completions", content=content), 400, None, field)


def test_lone_surrogate_names_the_field(server: Server) -> None:
    content = b'{"model": "fake-model", "prompt": "\\ud800", "max_tokens": 2}'
    resp = post(server, "/v1/completions", content=content)
    assert_error(resp, 400, "invalid_unicode", "prompt")
    # A valid pair, escaped the same way, is an ordinary character.
    pair = b'{"model": "fake-model", "prompt": "\\ud83d\\ude00", "max_tokens": 2}'
    resp = post(server, "/v1/completions", content=pair)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["prompt_tokens"] == len("\U0001f600".encode())


def test_body_too_large(tiny_server: Server) -> None:
    body = {**OK, "prompt": "a" * 5000}
    assert_error(post(tiny_server, "/v1/completions", json=body), 413, "request_too_large")


def test_unknown_route_and_method(server: Server) -> None:
    assert_error(httpx.get(server.url + "/v1/nothing", timeout=5), 404)
    assert_error(httpx.get(server.url + "/v1/completions", timeout=5), 405)


def test_openai_client_sees_typed_errors(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=10)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)
    assert info.value.param == "max_tokens"


@pytest.mark.parametrize("stream", [False, True])
def test_backend_error_before_first_token_keeps_its_status(server: Server, stream: bool) -> None:
    resp = post(server, "/v1/completions", json={**OK, "prompt": "[503]", "stream": stream})
    assert_error(resp, 503)
    assert resp.json()["error"]["type"] == "service_unavailable"
    assert "no decode node" in resp.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_deadline_gives_504_and_cancels_backend(server: Server, stream: bool) -> None:
    cancelled = len(server.backend.cancelled)
    resp = post(server, "/v1/completions", json={**OK, "prompt": "[hang]", "stream": stream})
    assert_error(resp, 504, "timeout")
    assert server.wait_cancelled(cancelled + 1)


def test_backend_crash_without_stream_is_a_500_with_body(server: Server) -> None:
    resp = post(server, "/v1/completions", json={**OK, "prompt": "[boom]"})
    assert_error(resp, 500, "internal_error")
    assert "engine exploded" in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    ("marker", "message"), [("[boom]", "engine exploded"), ("[gerr]", "decode node lost")]
)
def test_failure_mid_stream_ends_with_error_event(
    server: Server, marker: str, message: str
) -> None:
    body = {**OK, "prompt": marker, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=10) as resp:
        assert resp.status_code == 200
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert message in events[-2] and '"error"' in events[-2]
    tokens = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-2])
    assert len(tokens) == 2  # the fake fails after two tokens (in one or two chunks)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=10)
    with pytest.raises(openai.APIError, match=message):
        for _ in client.completions.create(model=MODEL, prompt=marker, max_tokens=8, stream=True):
            pass


def test_body_that_never_arrives_gets_408(server: Server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )  # 1 of 100 bytes, then silence
        reply = b""
        while b'"code":"request_timeout"' not in reply and (chunk := conn.recv(65536)):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408"), reply[:80]
    assert b'"code":"request_timeout"' in reply
