"""``POST /tokenize`` and ``/detokenize`` as vLLM serves them, counting as generation does."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from serve_api_fakes import MAX_CONTEXT_TOKENS, MODEL, Server

pytestmark = pytest.mark.timeout(30)


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=10)


def test_tokenize_prompt_matches_generation(server: Server) -> None:
    prompt = "héllo, wörld 😀"
    resp = post(server, "/tokenize", {"model": MODEL, "prompt": prompt})
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer == {
        "count": len(prompt.encode()), "max_model_len": MAX_CONTEXT_TOKENS,
        "tokens": list(prompt.encode()), "token_strs": None,
    }  # fmt: skip
    usage = post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert usage.json()["usage"]["prompt_tokens"] == answer["count"]


def test_tokenize_messages_matches_chat_usage(server: Server) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    answer = post(server, "/tokenize", {"messages": messages}).json()  # "model" is optional
    chat = post(server, "/v1/chat/completions", {"model": MODEL, "messages": messages})
    assert answer["count"] == chat.json()["usage"]["prompt_tokens"]
    assert bytes(answer["tokens"]) == b"system: be brief\nuser: hi\nassistant:"
    bare = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert bytes(bare.json()["tokens"]) == b"system: be brief\nuser: hi\n"


def test_tokenize_options(server: Server) -> None:
    body = {"prompt": "ab", "add_special_tokens": True, "return_token_strs": True, "zz": 1}
    answer = post(server, "/tokenize", body).json()
    assert answer["tokens"] == [97, 98] and answer["token_strs"] == ["a", "b"]
    assert post(server, "/tokenize", {"prompt": ""}).json()["count"] == 0


def test_detokenize_round_trip(server: Server) -> None:
    text = "naïve café"
    tokens = post(server, "/tokenize", {"prompt": text}).json()["tokens"]
    resp = post(server, "/detokenize", {"model": MODEL, "tokens": tokens})
    assert resp.status_code == 200 and resp.json() == {"prompt": text}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"messages": [{"role": "x", "content": "y"}]}, 400, "messages.0.role"),
        ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
        ("/tokenize", {"prompt": "x", "chat_template": "{{x}}"}, 400, "chat_template"),
        ("/detokenize", {"tokens": [1, 300]}, 400, "tokens.1"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
        ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model"),
    ],
)
def test_tokenizer_routes_refuse_bad_bodies(
    server: Server, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    resp = post(server, path, body)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["param"] == param
