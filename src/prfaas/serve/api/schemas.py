"""Request bodies of the generation and tokenizer endpoints, and what the gateway does with every
field a client may send.

Each field is in one of three groups (``docs/api.md`` has the table):
- *honoured*: a pydantic model below validates it (strict types, ranges) and the gateway acts on it;
- *accepted and ignored* (``Ignored``): its value cannot change the answer this gateway gives;
- *refused unless default* (``DefaultOnly``): a feature the engines lack; the values that mean
  "off" are accepted, any other is a 400 naming the field.
Any other field is unknown: dropped and named in one logged warning, as vLLM's server does, so
clients that send vLLM's or OpenAI's newer extras keep working. Nested objects (``stream_options``,
messages, content parts) treat their unknown keys the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from prfaas.serve.api.errors import ApiError, bad_request

MAX_TOKEN_ID = 2**31 - 1
"""Largest token id accepted anywhere when the tokenizer does not say its vocabulary size."""
MAX_SEED = 2**63 - 1
"""Seeds are 64-bit signed on every engine (``torch.Generator.manual_seed``); beyond is a 400."""
MAX_TOP_K = 2**31 - 1

TokenId = Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID)]
# allow_inf_nan=False: Python's json accepts 1e999 (inf); a non-finite sampling value is a 400.
_Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]


# ---------------------------------------------------------------------------------------------
# Fields outside the models: accepted-and-ignored, or refused unless they have their default.


@dataclass(frozen=True, slots=True)
class Ignored:
    """Accepted, and has no effect here; ``why`` is what docs/api.md says."""

    why: str
    types: tuple[type, ...] = ()
    """JSON types accepted (a wrong type is still a 400); empty = any."""

    def check(self, name: str, value: Any) -> None:
        if self.types and not _is_instance(value, self.types):
            names = " or ".join("null" if t is type(None) else _JSON_NAMES[t] for t in self.types)
            raise bad_request(
                f"invalid value for {name!r}: expected {names} (got {_short(value)})",
                param=name,
                code="type_error",
            )


@dataclass(frozen=True, slots=True)
class DefaultOnly:
    """A feature the gateway cannot honour: only ``allowed`` (the values meaning "off")."""

    allowed: tuple[Any, ...]
    why: str

    def check(self, name: str, value: Any) -> None:
        if not any(_same(value, a) for a in self.allowed):
            allowed = ", ".join(_json(a) for a in self.allowed)
            raise bad_request(
                f"{name}={_short(value)} is not supported ({self.why}); accepted: {allowed}",
                param=name,
                code="unsupported_value",
            )


Rule = Ignored | DefaultOnly

_JSON_NAMES: dict[type, str] = {
    str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "object",
}  # fmt: skip


def _is_instance(value: Any, types: tuple[type, ...]) -> bool:
    # JSON booleans are not numbers, although Python's bool is an int.
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def _same(value: Any, allowed: Any) -> bool:
    """JSON equality: 0 == 0.0, but false is not 0 and [] is not {}."""
    if allowed is None or isinstance(allowed, bool):
        return value is allowed
    if isinstance(allowed, int | float):
        return type(value) in (int, float) and value == allowed
    return type(value) is type(allowed) and bool(value == allowed)


def _json(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}": {_json(v)}' for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_json(v) for v in value) + "]"
    return repr(value)


_NO_STOP_STRINGS = "stop strings are not supported; use stop_token_ids"
_NO_STRUCTURED = "structured (guided) output is not supported"
_NO_LOGPROBS = "log-probabilities are not returned"
_ONLY_TEXT = "output text always skips special tokens"

COMMON_RULES: dict[str, Rule] = {
    "n": DefaultOnly((1, None), "one choice per request"),
    "best_of": DefaultOnly((1, None), "one sequence per request"),
    "use_beam_search": DefaultOnly((False, None), "no beam search"),
    "length_penalty": DefaultOnly((1, None), "no beam search"),
    "presence_penalty": DefaultOnly((0, None), "the engines apply repetition_penalty only"),
    "frequency_penalty": DefaultOnly((0, None), "the engines apply repetition_penalty only"),
    "logit_bias": DefaultOnly((None, {}), "no logit bias"),
    "min_p": DefaultOnly((0, None), "no min-p sampling"),
    "stop": DefaultOnly((None, []), _NO_STOP_STRINGS),
    "include_stop_str_in_output": DefaultOnly((False, None), _NO_STOP_STRINGS),
    "echo": DefaultOnly((False, None), "the prompt is not echoed"),
    "prompt_logprobs": DefaultOnly((None,), _NO_LOGPROBS),
    "return_tokens_as_token_ids": DefaultOnly((False, None), _NO_LOGPROBS),
    "skip_special_tokens": DefaultOnly((True, None), _ONLY_TEXT),
    "allowed_token_ids": DefaultOnly((None,), "no token restrictions"),
    "bad_words": DefaultOnly((None, []), "no token restrictions"),
    "logits_processors": DefaultOnly((None,), "no logits processors"),
    "truncate_prompt_tokens": DefaultOnly((None,), "prompts are never truncated"),
    "response_format": DefaultOnly((None, {"type": "text"}), _NO_STRUCTURED),
    "structured_outputs": DefaultOnly((None,), _NO_STRUCTURED),
    "guided_json": DefaultOnly((None,), _NO_STRUCTURED),
    "guided_regex": DefaultOnly((None,), _NO_STRUCTURED),
    "guided_choice": DefaultOnly((None,), _NO_STRUCTURED),
    "guided_grammar": DefaultOnly((None,), _NO_STRUCTURED),
    "prompt_embeds": DefaultOnly((None,), "prompts are text or token ids"),
    "user": Ignored("identifies the end user to OpenAI; unused here", (str, type(None))),
    "spaces_between_special_tokens": Ignored(
        "only matters when special tokens are kept, and they never are", (bool, type(None))
    ),
    "add_special_tokens": Ignored(
        "the gateway never adds special tokens to a prompt (chat templates add their own)",
        (bool, type(None)),
    ),
    "cache_salt": Ignored("the prefix cache is shared by the deployment", (str, type(None))),
    "request_id": Ignored("the gateway names every request itself", (str, type(None))),
    "priority": Ignored("requests are served first come, first served", (int, type(None))),
    "metadata": Ignored("not stored"),
    "store": Ignored("answers are not stored", (bool, type(None))),
    "service_tier": Ignored("one tier", (str, type(None))),
}

COMPLETION_RULES: dict[str, Rule] = {
    **COMMON_RULES,
    "logprobs": DefaultOnly((None,), _NO_LOGPROBS),
    "suffix": DefaultOnly((None, ""), "no insertion (suffix) completions"),
}

CHAT_RULES: dict[str, Rule] = {
    **COMMON_RULES,
    "logprobs": DefaultOnly((None, False), _NO_LOGPROBS),
    "top_logprobs": DefaultOnly((None, 0), _NO_LOGPROBS),
    "tools": DefaultOnly((None, []), "no tool calling"),
    "tool_choice": DefaultOnly((None, "none", "auto"), "no tool calling"),
    "functions": DefaultOnly((None, []), "no tool calling"),
    "function_call": DefaultOnly((None, "none", "auto"), "no tool calling"),
    "parallel_tool_calls": Ignored("no tool calling", (bool, type(None))),
    "modalities": DefaultOnly((None, ["text"]), "text output only"),
    "audio": DefaultOnly((None,), "text output only"),
    "prediction": DefaultOnly((None,), "no predicted outputs"),
    "continue_final_message": DefaultOnly((False, None), "the answer is a new message"),
    "chat_template": DefaultOnly((None,), "the model's own template is used"),
    "chat_template_kwargs": DefaultOnly((None, {}), "the model's own template is used"),
    "documents": DefaultOnly((None,), "the model's own template is used"),
    "mm_processor_kwargs": DefaultOnly((None,), "text input only"),
}

TOKENIZE_RULES: dict[str, Rule] = {
    "add_special_tokens": COMMON_RULES["add_special_tokens"],
    "continue_final_message": CHAT_RULES["continue_final_message"],
    "chat_template": CHAT_RULES["chat_template"],
    "chat_template_kwargs": CHAT_RULES["chat_template_kwargs"],
    "tools": CHAT_RULES["tools"],
    "mm_processor_kwargs": CHAT_RULES["mm_processor_kwargs"],
}


def split_fields(
    body: Mapping[str, Any], rules: Mapping[str, Rule], model: type[BaseModel]
) -> tuple[dict[str, Any], list[str]]:
    """The fields ``model`` validates, and the names of unknown fields (dropped). Checks every
    ruled field (a refused value raises a 400 naming it)."""
    kept: dict[str, Any] = {}
    unknown: list[str] = []
    honoured = model.model_fields
    for name, value in body.items():
        if name in honoured:
            kept[name] = value
        elif (rule := rules.get(name)) is not None:
            rule.check(name, value)
        else:
            unknown.append(name)
    return kept, unknown


# ---------------------------------------------------------------------------------------------
# Honoured fields.


class _Lenient(BaseModel):
    """Nested objects: unknown keys are kept aside (``model_extra``) to be named in the warning."""

    model_config = ConfigDict(extra="allow")


class StreamOptions(_Lenient):
    include_usage: StrictBool | None = None
    """A last chunk with ``"choices": []`` and ``usage``."""
    continuous_usage_stats: StrictBool | None = None
    """With ``include_usage``: every chunk carries the usage so far (as vLLM does)."""


class _Generation(BaseModel):
    model_config = ConfigDict(extra="forbid")  # split_fields has taken every other field out

    model: StrictStr
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    """The newer name of ``max_tokens``; wins when both are given (as vLLM)."""
    temperature: Annotated[_Float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[_Float, Field(gt=0.0, le=1.0)] | None = None
    top_k: StrictInt | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    repetition_penalty: Annotated[_Float, Field(gt=0.0)] | None = None
    ignore_eos: StrictBool | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    stop_token_ids: list[TokenId] | None = None
    return_token_ids: StrictBool | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and not (value in (-1, 0) or 1 <= value <= MAX_TOP_K):
            raise ValueError("top_k must be -1 or 0 (no limit) or between 1 and 2**31-1")
        return value

    def extra_names(self) -> list[str]:
        """Unknown keys met inside nested objects, as dotted paths."""
        options = self.stream_options
        return [f"stream_options.{k}" for k in (options.model_extra or {})] if options else []


class CompletionRequest(_Generation):
    prompt: StrictStr | list[TokenId]
    """Text, or token ids; a batch of one (``["text"]``, ``[[ids]]``) is unwrapped."""

    @field_validator("prompt", mode="before")
    @classmethod
    def _batch_of_one(cls, value: Any) -> Any:
        if isinstance(value, list) and value and isinstance(value[0], str | list):
            if len(value) != 1:
                raise ValueError(
                    f"a batch of {len(value)} prompts is not supported; send one per request"
                )
            return value[0]
        return value


class TextPart(_Lenient):
    type: StrictStr
    text: StrictStr

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"only 'text' content parts are supported, got {value!r}")
        return value


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    """None (an assistant turn that only called tools) renders as empty text."""
    name: StrictStr | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def extra_names(self, index: int) -> list[str]:
        names = [f"messages.{index}.{k}" for k in (self.model_extra or {})]
        if isinstance(self.content, list):
            for j, part in enumerate(self.content):
                names += [f"messages.{index}.content.{j}.{k}" for k in (part.model_extra or {})]
        return names


class ChatCompletionRequest(_Generation):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: StrictBool | None = None
    """vLLM's extra: end the rendered prompt with the assistant's turn (default true)."""

    def extra_names(self) -> list[str]:
        names = super().extra_names()
        for i, message in enumerate(self.messages):
            names += message.extra_names(i)
        return names


class TokenizeCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    prompt: StrictStr
    return_token_strs: StrictBool | None = None

    def extra_names(self) -> list[str]:
        return []


class TokenizeChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: StrictBool | None = None
    return_token_strs: StrictBool | None = None

    def extra_names(self) -> list[str]:
        return [n for i, m in enumerate(self.messages) for n in m.extra_names(i)]


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    tokens: list[TokenId]

    def extra_names(self) -> list[str]:
        return []


HONOURED_COMPLETION = tuple(CompletionRequest.model_fields)
HONOURED_CHAT = tuple(ChatCompletionRequest.model_fields)


def validate(model: type[Any], fields: dict[str, Any]) -> Any:
    """``model.model_validate(fields)``, a ``ValidationError`` becoming a 400 naming the field."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise validation_error(exc) from None


def validation_error(exc: ValidationError) -> ApiError:
    """The most telling problem pydantic found (a bad value before a wrong union member's type),
    as a 400 naming the field."""
    errors = sorted(
        exc.errors(include_url=False),
        key=lambda e: (e["type"] != "extra_forbidden", e["type"].endswith("_type")),
    )
    err = errors[0]
    # Drop union-member tags such as "str" or "list[constrained-int]" from the location.
    parts = [str(p) for p in err["loc"] if not (isinstance(p, str) and _is_type_tag(p))]
    param = ".".join(parts) or None
    kind = err["type"]
    if kind == "extra_forbidden":
        message = f"unknown field {param!r}"
    elif kind == "missing":
        message = f"missing required field {param!r}"
    else:
        got = _short(err.get("input"))
        message = f"invalid value for {param!r}: {err['msg']} (got {got})"
    return bad_request(message, param=param, code=kind)


def _is_type_tag(part: str) -> bool:
    return "[" in part or part in {"str", "int", "float", "bool", "list", "dict", "none"}


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # very deep nesting, or an int too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."
