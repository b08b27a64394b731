"""From an HTTP request to a validated ``GenerationRequest`` (or an ``ApiError`` saying why not).

Reads the body with a size cap and parses it as JSON, refusing what would break later code (deep
nesting, lone UTF-16 surrogates, NaN); sorts its fields (``schemas.split_fields``), validates the
honoured ones, checks the model, tokenizes the prompt (chat template or the plain join), resolves
``max_tokens`` against the context left and range-checks sampling against it.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Sequence, Sized
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from prfaas.serve.api.config import GatewayHTTPConfig
from prfaas.serve.api.errors import ApiError, bad_request
from prfaas.serve.api.schemas import (
    CHAT_RULES,
    COMPLETION_RULES,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    split_fields,
    validate,
)
from prfaas.serve.api.tokenizer import Tokenizer, render_chat
from prfaas.serve.backend import GenerationRequest, ModelInfo

MAX_JSON_DEPTH = 32
"""Deeper request bodies are refused: no request needs more, and deep trees make recursive code
(validation, error messages) fail."""
MIN_TEMPERATURE = 0.01
"""A temperature in (0, 0.01) is raised to 0.01, as vLLM does: smaller ones overflow the softmax
into NaN; 0 stays greedy."""

# A surrogate escape: the only way a lone surrogate gets into a str from UTF-8 JSON (valid pairs
# are escaped the same way, so a match only says the tree must be checked).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass(frozen=True, slots=True)
class Prepared:
    req: GenerationRequest
    chat: bool
    model: str
    stream: bool
    include_usage: bool
    """A final usage chunk (``stream_options.include_usage``)."""
    continuous_usage: bool
    """Usage on every chunk (``stream_options.continuous_usage_stats`` with ``include_usage``)."""
    return_token_ids: bool
    unknown_fields: tuple[str, ...]
    """Fields the client sent that the gateway does not know (dropped; logged once)."""


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
    return parse_json(b"".join(chunks))


def parse_json(raw: bytes) -> dict[str, Any]:
    """A JSON object from UTF-8 bytes, or a 400 that says what is wrong with them."""
    try:
        text = raw.decode("utf-8")
        body = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise _invalid_json(f"nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # bad JSON or UTF-8, NaN/Infinity, an int of over 4300 digits
        raise _invalid_json(f"is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request(f"request body must be a JSON object, got {type(body).__name__}")
    # Cheap gates (C-speed scans) before walking the tree in Python.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH or _SURROGATE_ESCAPE.search(text):
        _check_tree(body)
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _invalid_json(what: str, param: str | None = None) -> ApiError:
    return bad_request(f"request body {what}", param=param, code="invalid_json")


def _check_tree(body: dict[str, Any]) -> None:
    """Refuse nesting beyond ``MAX_JSON_DEPTH`` and strings holding a lone surrogate (no UTF-8
    form: tokenizers and JSON answers quoting them would fail). Iterative: no recursion."""
    stack: list[tuple[dict[str, Any] | list[Any], int, str]] = [(body, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _invalid_json(f"nests deeper than {MAX_JSON_DEPTH} levels", path or None)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, item in items:
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and _lone_surrogate(key):
                raise _surrogate(path or None)
            if isinstance(item, str):
                if _lone_surrogate(item):
                    raise _surrogate(where)
            elif isinstance(item, dict | list):
                stack.append((item, depth + 1, where))


def _lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _surrogate(param: str | None) -> ApiError:
    return bad_request(
        f"invalid value for {param!r}: a lone UTF-16 surrogate escape (\\ud800-\\udfff without "
        "its pair) is not Unicode text",
        param=param,
        code="invalid_unicode",
    )


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
    model_cls = ChatCompletionRequest if chat else CompletionRequest
    fields, unknown = split_fields(body, CHAT_RULES if chat else COMPLETION_RULES, model_cls)
    parsed: CompletionRequest | ChatCompletionRequest = validate(model_cls, fields)
    check_model(parsed.model, info)
    vocab = vocab_size(tokenizer)
    prompt = _prompt_ids(parsed, tokenizer, vocab)
    max_tokens = _max_tokens(parsed, len(prompt), info, config)
    stream = bool(parsed.stream)
    options = parsed.stream_options
    if options is not None and not stream:
        raise bad_request("stream_options is only allowed with stream=true", param="stream_options")
    include_usage = bool(options and options.include_usage)
    req = GenerationRequest(
        request_id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
        prompt_token_ids=tuple(prompt),
        max_tokens=max_tokens,
        arrival_s=arrival_s,
        **_sampling(parsed, max_tokens, vocab),
    )
    return Prepared(
        req,
        chat,
        info.name,
        stream,
        include_usage,
        include_usage and bool(options and options.continuous_usage_stats),
        bool(parsed.return_token_ids),
        tuple(unknown + parsed.extra_names()),
    )


def check_model(model: str | None, info: ModelInfo) -> None:
    if model is not None and model != info.name:
        raise ApiError(
            404,
            f"model {model!r} does not exist; this gateway serves {info.name!r}",
            param="model",
            code="model_not_found",
        )


def _sampling(
    parsed: CompletionRequest | ChatCompletionRequest, max_tokens: int, vocab: int | None
) -> dict[str, Any]:
    """The sampling fields of ``GenerationRequest``, defaults filled in, checked against each
    other and the vocabulary."""
    temperature = 1.0 if parsed.temperature is None else float(parsed.temperature)
    if 0 < temperature < MIN_TEMPERATURE:
        temperature = MIN_TEMPERATURE
    top_k = -1 if parsed.top_k in (None, 0) else parsed.top_k
    assert top_k is not None
    if vocab is not None and top_k >= vocab:
        top_k = -1  # the whole vocabulary: the same as no limit
    min_tokens = parsed.min_tokens or 0
    if min_tokens > max_tokens:
        raise bad_request(
            f"min_tokens={min_tokens} exceeds max_tokens={max_tokens}", param="min_tokens"
        )
    stop = tuple(parsed.stop_token_ids or ())
    check_vocab(stop, vocab, "stop_token_ids")
    return {
        "temperature": temperature,
        "top_p": 1.0 if parsed.top_p is None else float(parsed.top_p),
        "seed": parsed.seed,
        "stop_token_ids": stop,
        "top_k": top_k,
        "min_tokens": min_tokens,
        "repetition_penalty": (
            1.0 if parsed.repetition_penalty is None else float(parsed.repetition_penalty)
        ),
        "ignore_eos": bool(parsed.ignore_eos),
    }


def _prompt_ids(
    parsed: CompletionRequest | ChatCompletionRequest, tokenizer: Tokenizer, vocab: int | None
) -> list[int]:
    if isinstance(parsed, ChatCompletionRequest):
        add_generation_prompt = parsed.add_generation_prompt is not False
        return chat_ids(tokenizer, parsed.messages, add_generation_prompt)
    if isinstance(parsed.prompt, str):
        ids = encode(tokenizer, parsed.prompt, "prompt") if parsed.prompt else []
    else:
        ids = list(parsed.prompt)
        check_vocab(ids, vocab, "prompt")
    if not ids:
        raise bad_request("prompt is empty", param="prompt", code="empty_prompt")
    return ids


def chat_ids(
    tokenizer: Tokenizer, messages: Sequence[ChatMessage], add_generation_prompt: bool
) -> list[int]:
    """The token ids of a chat prompt, as every endpoint renders it."""
    rendered = [{"role": m.role, "content": m.text()} for m in messages]
    if not any(m["content"] for m in rendered):
        raise bad_request("every message is empty", param="messages", code="empty_prompt")
    try:
        return render_chat(tokenizer, rendered, add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # the template refusing these messages (jinja's TemplateError, ...)
        raise bad_request(f"messages could not be tokenized: {exc}", param="messages") from None


def encode(tokenizer: Tokenizer, text: str, param: str) -> list[int]:
    try:
        return list(tokenizer.encode(text))
    except ValueError as exc:
        raise bad_request(f"{param} could not be tokenized: {exc}", param=param) from None


def check_vocab(ids: Sequence[int], vocab: int | None, param: str) -> None:
    if vocab is None:
        return
    for i, t in enumerate(ids):
        if t >= vocab:
            raise bad_request(
                f"token id {t} is outside the vocabulary (size {vocab})", param=f"{param}.{i}"
            )


def vocab_size(tokenizer: Tokenizer) -> int | None:
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
    if parsed.max_completion_tokens is not None:  # the newer name wins, as in vLLM
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
