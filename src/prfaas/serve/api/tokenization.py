"""``POST /tokenize`` and ``POST /detokenize``, as vLLM serves them, counting exactly as the
generation endpoints do (the same chat rendering; no special tokens added to a prompt).

``/tokenize``: ``{"model"?, "prompt"}`` or ``{"model"?, "messages", "add_generation_prompt"?}``
(plus ``return_token_strs``) -> ``{"count", "max_model_len", "tokens", "token_strs"}``.
``/detokenize``: ``{"model"?, "tokens"}`` -> ``{"prompt"}``. Fields are sorted as in
``schemas`` (unknown ones dropped and logged once). No admission: tokenizing is cheap and the body
is bounded by ``max_body_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from prfaas.serve.api.errors import ApiError, error_response
from prfaas.serve.api.prepare import (
    chat_ids,
    check_model,
    check_vocab,
    encode,
    read_json,
    vocab_size,
)
from prfaas.serve.api.schemas import (
    TOKENIZE_RULES,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    split_fields,
    validate,
)
from prfaas.serve.api.state import GatewayState
from prfaas.serve.api.tokenizer import Tokenizer
from prfaas.serve.api.tracking import CLIENT_GONE
from prfaas.serve.backend import ModelInfo


def add_tokenizer_routes(app: FastAPI, gateway: GatewayState) -> None:
    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        return await _answer(request, gateway, tokenize_body)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        return await _answer(request, gateway, detokenize_body)


Work = Callable[[dict[str, Any], ModelInfo, Tokenizer], tuple[dict[str, Any], list[str]]]


async def _answer(request: Request, gateway: GatewayState, work: Work) -> Response:
    config = gateway.config
    try:
        body = await read_json(request, config.max_body_bytes, config.request_timeout_s)
        answer, unknown = work(body, gateway.backend.model_info(), gateway.tokenizer)
    except ApiError as exc:
        return error_response(exc)
    except ClientDisconnect:
        return Response(status_code=CLIENT_GONE)
    gateway.unknown_fields.note(request.url.path, tuple(unknown))
    return JSONResponse(answer)


def tokenize_body(
    body: dict[str, Any], info: ModelInfo, tokenizer: Tokenizer
) -> tuple[dict[str, Any], list[str]]:
    """The answer to a ``/tokenize`` body, and the unknown fields it had."""
    parsed: TokenizeChatRequest | TokenizeCompletionRequest
    if "messages" in body:
        fields, unknown = split_fields(body, TOKENIZE_RULES, TokenizeChatRequest)
        chat: TokenizeChatRequest = validate(TokenizeChatRequest, fields)
        check_model(chat.model, info)
        ids = chat_ids(tokenizer, chat.messages, chat.add_generation_prompt is not False)
        parsed = chat
    else:
        fields, unknown = split_fields(body, TOKENIZE_RULES, TokenizeCompletionRequest)
        text: TokenizeCompletionRequest = validate(TokenizeCompletionRequest, fields)
        check_model(text.model, info)
        ids = encode(tokenizer, text.prompt, "prompt") if text.prompt else []
        parsed = text
    answer = {
        "count": len(ids),
        "max_model_len": info.max_context_tokens,
        "tokens": ids,
        "token_strs": _token_strs(tokenizer, ids) if parsed.return_token_strs else None,
    }
    return answer, unknown + parsed.extra_names()


def detokenize_body(
    body: dict[str, Any], info: ModelInfo, tokenizer: Tokenizer
) -> tuple[dict[str, Any], list[str]]:
    fields, unknown = split_fields(body, {}, DetokenizeRequest)
    parsed = validate(DetokenizeRequest, fields)
    check_model(parsed.model, info)
    check_vocab(parsed.tokens, vocab_size(tokenizer), "tokens")
    return {"prompt": tokenizer.decode(list(parsed.tokens))}, unknown


def _token_strs(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """The tokenizer's own token strings where it has them (Hugging Face: ``"Ġhello"``), else
    each token decoded alone (a byte of a multi-byte character shows as U+FFFD)."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if convert is not None:
        return [str(t) for t in convert(ids)]
    return [tokenizer.decode([t]) for t in ids]
