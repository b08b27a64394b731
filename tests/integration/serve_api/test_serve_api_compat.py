"""What real benchmark clients send is served as vLLM serves it: the exact bodies of ``vllm bench
serve`` and guidellm, vLLM's sampling extras reaching the backend, standard fields at their
defaults accepted, unknown fields ignored with one warning, usage with cached tokens (on every
chunk with ``continuous_usage_stats``), and ``GET /ready``."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai
import pytest
from serve_api_fakes import MODEL, Server, expected_tokens

pytestmark = pytest.mark.timeout(30)


def sse_events(resp: httpx.Response) -> list[Any]:
    datas = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]", datas[-3:]
    return [json.loads(d) for d in datas[:-1]]


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=10)


def test_vllm_bench_serve_body(server: Server) -> None:
    prompt = "The quick brown fox"
    body = {
        "model": MODEL, "prompt": prompt, "repetition_penalty": 1.0, "max_tokens": 8,
        "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }  # fmt: skip
    resp = post(server, "/v1/completions", body)
    assert resp.status_code == 200, resp.text
    events = sse_events(resp)
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert text == bytes(expected_tokens(tuple(prompt.encode()), 8)).decode()
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {
        "prompt_tokens": len(prompt), "completion_tokens": 8, "total_tokens": len(prompt) + 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }  # fmt: skip
    assert all("usage" not in e for e in events[:-1])  # no continuous_usage_stats asked
    req = server.backend.last_request
    assert req is not None and req.ignore_eos and req.repetition_penalty == 1.0


def test_guidellm_chat_body_with_continuous_usage(server: Server) -> None:
    messages = [{"role": "user", "content": "Summarise the plot of Hamlet."}]
    body = {
        "model": MODEL, "messages": messages, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_completion_tokens": 16, "ignore_eos": True,
    }  # fmt: skip
    resp = post(server, "/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text
    events = sse_events(resp)
    num_prompt = len(f"user: {messages[0]['content']}\nassistant:")
    assert all(e["usage"]["prompt_tokens"] == num_prompt for e in events)  # on every chunk
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == 16
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert len(content) == 16
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] == num_prompt + 16
    assert server.backend.last_request is not None and server.backend.last_request.ignore_eos


def test_vllm_sampling_extras_reach_the_backend(server: Server) -> None:
    body = {
        "model": MODEL, "prompt": "x", "max_tokens": 6, "top_k": 20, "min_tokens": 3,
        "repetition_penalty": 1.3, "ignore_eos": True, "temperature": 0.7, "top_p": 0.9,
        "seed": 2**63 - 1, "stop_token_ids": [10],
    }  # fmt: skip
    assert post(server, "/v1/completions", body).status_code == 200
    req = server.backend.last_request
    assert req is not None
    got = (req.top_k, req.min_tokens, req.repetition_penalty, req.ignore_eos, req.temperature)
    assert got == (20, 3, 1.3, True, 0.7)
    assert (req.top_p, req.seed, req.stop_token_ids) == (0.9, 2**63 - 1, (10,))


@pytest.mark.parametrize(
    ("change", "field", "value"),
    [
        ({"top_k": 0}, "top_k", -1),  # 0 means no limit, as in vLLM
        ({"top_k": 257}, "top_k", -1),  # the whole vocabulary (257) is no limit either
        ({"temperature": 1e-40}, "temperature", 0.01),  # would overflow softmax: raised, as vLLM
        ({"temperature": 0}, "temperature", 0.0),  # greedy stays greedy
        ({"temperature": None, "top_p": None}, "temperature", 1.0),
        ({"max_tokens": 3, "max_completion_tokens": 5}, "max_tokens", 5),  # newer name wins
        ({"max_tokens": None}, "max_tokens", 16),  # the server's default
        ({"min_tokens": None, "ignore_eos": None}, "min_tokens", 0),
    ],
)
def test_defaults_and_normalisation(
    server: Server, change: dict[str, Any], field: str, value: object
) -> None:
    body = {"model": MODEL, "prompt": "y", "max_tokens": 4, **change}
    assert post(server, "/v1/completions", body).status_code == 200
    assert getattr(server.backend.last_request, field) == value


STANDARD_DEFAULTS: dict[str, Any] = {
    "n": 1, "best_of": 1, "logprobs": None, "echo": False, "presence_penalty": 0,
    "frequency_penalty": 0.0, "user": "someone", "stop": None, "logit_bias": {},
    "skip_special_tokens": True, "spaces_between_special_tokens": True, "min_p": 0.0,
    "response_format": {"type": "text"}, "add_special_tokens": True, "include_stop_str_in_output":
    False, "use_beam_search": False, "prompt_logprobs": None, "truncate_prompt_tokens": None,
    "cache_salt": "s", "priority": 0, "metadata": {"k": "v"}, "store": False,
}  # fmt: skip


def test_standard_fields_at_their_defaults_are_accepted(server: Server) -> None:
    completion = {"model": MODEL, "prompt": "z", "max_tokens": 2, "suffix": None}
    assert post(server, "/v1/completions", {**completion, **STANDARD_DEFAULTS}).status_code == 200
    chat = {
        "model": MODEL, "max_tokens": 2, "logprobs": False, "top_logprobs": 0, "tools": [],
        "tool_choice": "none", "parallel_tool_calls": True, "modalities": ["text"],
        "messages": [
            {"role": "system", "content": "s", "name": "sys"},
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "content": "r", "tool_call_id": "t1"},
            {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {}}]},
        ],
    }  # fmt: skip
    resp = post(server, "/v1/chat/completions", {**chat, **STANDARD_DEFAULTS, "logprobs": False})
    assert resp.status_code == 200, resp.text
    req = server.backend.last_request
    assert req is not None
    assert bytes(req.prompt_token_ids) == b"system: s\nassistant: \ntool: r\nuser: q\nassistant:"


def test_unknown_fields_are_ignored_with_one_warning(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    body = {
        "model": MODEL, "prompt": "w", "max_tokens": 2, "frobnicate": True, "vllm_xargs": {},
        "stream": True, "stream_options": {"include_usage": True, "future_option": 1},
    }  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="prfaas.serve.api"):
        for _ in range(3):
            assert post(server, "/v1/completions", body).status_code == 200
    warnings = [r.getMessage() for r in caplog.records if "unknown field" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per distinct set, not per request
    for name in ("frobnicate", "vllm_xargs", "stream_options.future_option"):
        assert name in warnings[0]


def test_batch_of_one_prompt_is_unwrapped(server: Server) -> None:
    for prompt in (["hey"], [[104, 101, 121]]):
        resp = post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 3})
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["text"] == bytes(expected_tokens(b"hey", 3)).decode()


def test_chat_without_generation_prompt(server: Server) -> None:
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "add_generation_prompt": False,
    }  # fmt: skip
    assert post(server, "/v1/chat/completions", body).status_code == 200
    assert server.backend.last_request is not None
    assert bytes(server.backend.last_request.prompt_token_ids) == b"user: hi\n"


@pytest.mark.parametrize("stream", [False, True])
def test_cached_tokens_reach_usage(server: Server, stream: bool) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=10)
    prompt = "[cached] a prompt half in the prefix cache"
    if stream:
        chunks = list(
            client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=3, stream=True,
                stream_options={"include_usage": True},
            )
        )  # fmt: skip
        usage = chunks[-1].usage
    else:
        usage = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == len(prompt) // 2
    plain = client.completions.create(model=MODEL, prompt="no hit", max_tokens=3).usage
    assert plain is not None and plain.prompt_tokens_details is not None
    assert plain.prompt_tokens_details.cached_tokens == 0


def test_ready_reports_the_backends_reason(server: Server) -> None:
    resp = httpx.get(server.url + "/ready", timeout=5)
    assert (resp.status_code, resp.json()) == (200, {"status": "ready"})
    server.backend.not_ready = "no decode node in rotation"
    try:
        resp = httpx.get(server.url + "/ready", timeout=5)
        assert resp.status_code == 503
        error = resp.json()["error"]
        assert "no decode node in rotation" in error["message"]
        assert (error["type"], error["code"]) == ("service_unavailable", "not_ready")
        health = httpx.get(server.url + "/health", timeout=5)  # liveness is another question
        assert health.status_code == 200 and {"in_flight", "queued"} <= set(health.json())
    finally:
        server.backend.not_ready = None
