"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions`` (pydantic, extra="forbid").

Only what the gateway honours is accepted; an unknown field, a wrong type or an out-of-range value
is a 400 naming the field (see ``validation_error``). Extensions beyond OpenAI's API (documented
in docs/api.md): ``stop_token_ids`` and ``return_token_ids``, both as in vLLM.
"""

from __future__ import annotations

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

NonNegInt = Annotated[StrictInt, Field(ge=0)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: Annotated[float, Field(strict=True, ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(strict=True, gt=0.0, le=1.0)] = 1.0
    n: Literal[1] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    """Stop *strings* are not supported (tokens only: ``stop_token_ids``); null or [] is fine."""
    stop_token_ids: list[NonNegInt] = Field(default_factory=list)
    presence_penalty: Annotated[float, Field(strict=True)] = 0.0
    frequency_penalty: Annotated[float, Field(strict=True)] = 0.0
    user: StrictStr | None = None
    return_token_ids: StrictBool = False

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalties(cls, value: float) -> float:
        if value != 0:
            raise ValueError("penalties are not supported; only 0 is accepted")
        return value

    @field_validator("stop")
    @classmethod
    def _no_stop_strings(cls, value: str | list[str] | None) -> None:
        if value:
            raise ValueError("stop strings are not supported; use stop_token_ids")
        return None


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[NonNegInt]
    """Text, or token ids. Batched prompts (a list of strings) are not supported."""
    echo: Literal[False] = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: StrictStr


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: StrictInt | None = None
    """The newer name of ``max_tokens``; giving both is an error."""


ChatMessage.model_rebuild()


def validation_error(exc: ValidationError) -> ApiError:
    """The first problem pydantic found (unknown fields first), as a 400 naming the field."""
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
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
