"""From an HTTP request to a validated ``GenerationRequest`` (or an ``ApiError`` saying why not).

Reads the body with a size cap, parses JSON, validates the schema, checks the model, tokenizes the
prompt (chat template or the plain join), and resolves ``max_tokens`` against the context left.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from prfaas.serve.api.config import GatewayHTTPConfig
from prfaas.serve.api.errors import ApiError, bad_request
from prfaas.serve.api.schemas import ChatCompletionRequest, CompletionRequest, validation_error
from prfaas.serve.api.tokenizer import Tokenizer, render_chat
from prfaas.serve.backend import GenerationRequest, ModelInfo


@dataclass(frozen=True, slots=True)
class Prepared:
    req: GenerationRequest
    model: str
    stream: bool
    include_usage: bool
    return_token_ids: bool


async def read_json(request: Request, max_body_bytes: int, timeout_s: float) -> dict[str, Any]:
    """The body as a JSON object; 413 if too large, 408 if it does not arrive within
    ``timeout_s``, ``ClientDisconnect`` (starlette) if the client leaves meanwhile."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise _too_large(max_body_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_body_bytes:
                    raise _too_large(max_body_bytes)
                chunks.append(chunk)
    except TimeoutError:
        message = f"request body not received within {timeout_s:g} s"
        raise ApiError(408, message, code="request_timeout") from None
    try:
        body = json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _too_large(max_body_bytes: int) -> ApiError:
    return ApiError(413, f"request body exceeds {max_body_bytes} bytes", code="request_too_large")


def prepare(
    body: dict[str, Any],
    *,
    chat: bool,
    info: ModelInfo,
    tokenizer: Tokenizer,
    config: GatewayHTTPConfig,
    arrival_s: float,
) -> Prepared:
    try:
        parsed: CompletionRequest | ChatCompletionRequest = (
            ChatCompletionRequest.model_validate(body)
            if chat
            else CompletionRequest.model_validate(body)
        )
    except ValidationError as exc:
        raise validation_error(exc) from None
    if parsed.model != info.name:
        raise ApiError(
            404,
            f"model {parsed.model!r} does not exist; this gateway serves {info.name!r}",
            param="model",
            code="model_not_found",
        )
    prompt = _prompt_ids(parsed, tokenizer)
    max_tokens = _max_tokens(parsed, len(prompt), info, config)
    prefix = "chatcmpl-" if chat else "cmpl-"
    req = GenerationRequest(
        request_id=prefix + uuid.uuid4().hex,
        prompt_token_ids=tuple(prompt),
        max_tokens=max_tokens,
        temperature=parsed.temperature,
        top_p=parsed.top_p,
        seed=parsed.seed,
        stop_token_ids=tuple(parsed.stop_token_ids),
        arrival_s=arrival_s,
    )
    options = parsed.stream_options
    if options is not None and not parsed.stream:
        raise bad_request("stream_options is only allowed with stream=true", param="stream_options")
    return Prepared(
        req,
        info.name,
        parsed.stream,
        bool(options and options.include_usage),
        parsed.return_token_ids,
    )


def _prompt_ids(
    parsed: CompletionRequest | ChatCompletionRequest, tokenizer: Tokenizer
) -> list[int]:
    if isinstance(parsed, ChatCompletionRequest):
        messages = [{"role": m.role, "content": m.text()} for m in parsed.messages]
        if not any(m["content"] for m in messages):
            raise bad_request("every message is empty", param="messages", code="empty_prompt")
        return render_chat(tokenizer, messages)
    if isinstance(parsed.prompt, str):
        ids = list(tokenizer.encode(parsed.prompt)) if parsed.prompt else []
    else:
        ids = list(parsed.prompt)
        vocab = _vocab_size(tokenizer)
        bad = [t for t in ids if vocab is not None and t >= vocab]
        if bad:
            raise bad_request(
                f"token id {bad[0]} is outside the vocabulary (size {vocab})", param="prompt"
            )
    if not ids:
        raise bad_request("prompt is empty", param="prompt", code="empty_prompt")
    return ids


def _vocab_size(tokenizer: Tokenizer) -> int | None:
    if isinstance(tokenizer, Sized):
        return len(tokenizer)
    size = getattr(tokenizer, "vocab_size", None)
    return size if isinstance(size, int) else None


def _max_tokens(
    parsed: CompletionRequest | ChatCompletionRequest,
    num_prompt_tokens: int,
    info: ModelInfo,
    config: GatewayHTTPConfig,
) -> int:
    limit = info.max_context_tokens
    if num_prompt_tokens >= limit:
        raise bad_request(
            f"prompt is {num_prompt_tokens} tokens; {info.name} allows at most {limit - 1} "
            f"(context of {limit} tokens, at least one generated)",
            param="messages" if isinstance(parsed, ChatCompletionRequest) else "prompt",
            code="context_length_exceeded",
        )
    left = limit - num_prompt_tokens
    value, param = parsed.max_tokens, "max_tokens"
    if isinstance(parsed, ChatCompletionRequest) and parsed.max_completion_tokens is not None:
        if value is not None:
            raise bad_request("give max_tokens or max_completion_tokens, not both", param=param)
        value, param = parsed.max_completion_tokens, "max_completion_tokens"
    if value is None:
        return min(config.default_max_tokens, left)
    if value < 1:
        raise bad_request(f"{param} must be >= 1, got {value}", param=param)
    if value > left:
        raise bad_request(
            f"{param}={value} exceeds the context left: {limit} - {num_prompt_tokens} prompt "
            f"tokens = {left}",
            param=param,
            code="context_length_exceeded",
        )
    return value
