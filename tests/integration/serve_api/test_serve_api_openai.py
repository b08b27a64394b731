"""The official ``openai`` client against the gateway (fake backend): both endpoints, streaming
and not, plus the read-only routes."""

from __future__ import annotations

import httpx
import openai
import pytest
from serve_api_fakes import MAX_CONTEXT_TOKENS, MODEL, Server, expected_tokens

pytestmark = pytest.mark.timeout(30)


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def text_of(tokens: list[int]) -> str:
    return bytes(tokens).decode()


def test_completion_non_streaming(server: Server) -> None:
    prompt = "Hello, world"
    answer = client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=7)
    want = expected_tokens(tuple(prompt.encode()), 7)
    assert answer.choices[0].text == text_of(want)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(prompt), 7)
    assert answer.usage.total_tokens == len(prompt) + 7
    assert answer.model == MODEL and answer.id.startswith("cmpl-")


def test_completion_streaming_matches_non_streaming(server: Server) -> None:
    prompt = "stream me"
    stream = client(server).completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == text_of(expected_tokens(tuple(prompt.encode()), 9))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9


def test_prompt_as_token_ids_and_stop_token(server: Server) -> None:
    prompt = [104, 105]
    full = expected_tokens(tuple(prompt), 10)
    stop = full[4]
    answer = client(server).completions.create(
        model=MODEL, prompt=prompt, max_tokens=10,
        extra_body={"stop_token_ids": [stop], "return_token_ids": True},
    )  # fmt: skip
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].text == text_of(full[:4])
    assert answer.choices[0].model_extra["token_ids"] == full[:4]  # type: ignore[index]
    assert server.backend.last_request is not None
    assert server.backend.last_request.stop_token_ids == (stop,)


def test_sampling_fields_reach_backend(server: Server) -> None:
    client(server).completions.create(
        model=MODEL, prompt="x", max_tokens=1, temperature=0, top_p=0.5, seed=7
    )
    req = server.backend.last_request
    assert req is not None
    assert (req.temperature, req.top_p, req.seed, req.max_tokens) == (0.0, 0.5, 7, 1)


def test_default_max_tokens_is_clipped_to_the_context(server: Server) -> None:
    prompt = [97] * (MAX_CONTEXT_TOKENS - 3)
    answer = client(server).completions.create(model=MODEL, prompt=prompt)
    assert answer.usage is not None and answer.usage.completion_tokens == 3


def test_chat_non_streaming_uses_plain_join(server: Server) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    answer = client(server).chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=5,  # type: ignore[arg-type]
    )
    prompt = b"system: be brief\nuser: hi\nassistant:"
    assert answer.choices[0].message.content == text_of(expected_tokens(tuple(prompt), 5))
    assert answer.choices[0].message.role == "assistant"
    assert answer.usage is not None and answer.usage.prompt_tokens == len(prompt)
    assert answer.id.startswith("chatcmpl-")


def test_chat_streaming(server: Server) -> None:
    stream = client(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": "hey"}]}],
        max_completion_tokens=6,
        stream=True,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == text_of(expected_tokens(tuple(b"user: hey\nassistant:"), 6))
    assert chunks[-1].choices[0].finish_reason == "length"


def test_backend_overrunning_max_tokens_is_capped(server: Server) -> None:
    answer = client(server).completions.create(model=MODEL, prompt="[overrun]", max_tokens=4)
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    assert answer.choices[0].finish_reason == "length"


def test_models_and_health(server: Server) -> None:
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client(server).models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client(server).models.retrieve("nope")
    health = httpx.get(server.url + "/health", timeout=5)
    assert health.status_code == 200 and health.json()["backend"]["nodes"] == 1
    server.backend.healthy = False
    try:
        assert httpx.get(server.url + "/health", timeout=5).status_code == 503
    finally:
        server.backend.healthy = True
