"""JSON bodies and SSE chunks of the two OpenAI endpoints (text completions and chat).

``Format`` knows one endpoint's object names and choice shape; ``sse()`` frames one event.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from prfaas.serve.api.relay import Delta

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def usage(
    num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int = 0
) -> dict[str, Any]:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens`` is the prefix-cache hit."""
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
        "prompt_tokens_details": {"cached_tokens": num_cached_tokens},
    }


@dataclass(slots=True)
class Format:
    chat: bool
    request_id: str
    model: str
    return_token_ids: bool
    created: int = field(default_factory=lambda: int(time.time()))

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def _choice(self, key: str, value: Any, token_ids: Any, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, key: value, "logprobs": None, "finish_reason": finish}
        if self.return_token_ids:
            choice["token_ids"] = list(token_ids)
        return choice

    def full(
        self, text: str, token_ids: list[int], finish: str, usage: dict[str, Any]
    ) -> dict[str, Any]:
        """The non-streaming answer."""
        if self.chat:
            body = self._head("chat.completion")
            message = {"role": "assistant", "content": text}
            body["choices"] = [self._choice("message", message, token_ids, finish)]
        else:
            body = self._head("text_completion")
            body["choices"] = [self._choice("text", text, token_ids, finish)]
        body["usage"] = usage
        return body

    def opening(self, usage: dict[str, Any] | None = None) -> bytes:
        """Chat streams open with an empty assistant delta, as OpenAI's do; completions don't.
        ``usage``: the usage so far, on every chunk (``continuous_usage_stats``)."""
        if not self.chat:
            return b""
        body = self._head("chat.completion.chunk")
        body["choices"] = [self._choice("delta", {"role": "assistant", "content": ""}, (), None)]
        if usage is not None:
            body["usage"] = usage
        return sse(body)

    def chunk(self, delta: Delta, usage: dict[str, Any] | None = None) -> bytes:
        if self.chat:
            body = self._head("chat.completion.chunk")
            content = {"content": delta.text} if delta.text or not delta.finish_reason else {}
            body["choices"] = [self._choice("delta", content, delta.token_ids, delta.finish_reason)]
        else:
            body = self._head("text_completion")
            body["choices"] = [
                self._choice("text", delta.text, delta.token_ids, delta.finish_reason)
            ]
        if usage is not None:
            body["usage"] = usage
        return sse(body)

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        """The last chunk when ``stream_options.include_usage``: no choices, just usage."""
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage
        return sse(body)
