"""One streaming ``/v1/completions`` request, timed: TTFT, gaps between chunks, outcome.

Works against any OpenAI-compatible server. A failure never raises: it becomes a
``RequestResult`` with a short ``reason`` (``http_429``, ``timeout``, ``connect_error``,
``stream_error``, ``incomplete_stream`` ...) so the report can count failures by reason.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from prfaas.serve.http_lines import aiter_lines


@dataclass(frozen=True, slots=True)
class RequestResult:
    index: int
    num_prompt_tokens: int
    ok: bool
    reason: str | None
    """None when ok; else why it failed (counted by the report)."""
    status: int | None
    """HTTP status, if a response came."""
    sent_s: float
    """When it was sent, from the start of the run."""
    ttft_s: float | None
    latency_s: float | None
    num_output_tokens: int
    chunk_gaps_s: tuple[float, ...]
    """Time between successive token-carrying chunks (one chunk ~ one token on most servers)."""
    message: str = ""

    @property
    def tpot_s(self) -> float | None:
        """Per-token latency after the first: (last - first token) / (tokens - 1)."""
        if self.ttft_s is None or self.latency_s is None or self.num_output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.num_output_tokens - 1)


def _failure(
    index: int, n: int, sent_s: float, reason: str, status: int | None = None, message: str = ""
) -> RequestResult:
    return RequestResult(index, n, False, reason, status, sent_s, None, None, 0, (), message[:200])


async def stream_completion(
    client: httpx.AsyncClient,
    *,
    url: str,
    body: dict[str, Any],
    index: int,
    num_prompt_tokens: int,
    sent_s: float,
    timeout_s: float,
) -> RequestResult:
    n = num_prompt_tokens
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    return _failure(
                        index,
                        n,
                        sent_s,
                        f"http_{resp.status_code}",
                        resp.status_code,
                        _message(text),
                    )
                return await _read_stream(resp, index, n, sent_s, start)
    except TimeoutError:
        return _failure(index, n, sent_s, "timeout", message=f"no answer within {timeout_s:g} s")
    except httpx.TimeoutException as exc:
        return _failure(index, n, sent_s, "timeout", message=str(exc))
    except httpx.ConnectError as exc:
        return _failure(index, n, sent_s, "connect_error", message=str(exc))
    except httpx.HTTPError as exc:
        return _failure(index, n, sent_s, "transport_error", message=f"{type(exc).__name__}: {exc}")


async def _read_stream(
    resp: httpx.Response, index: int, n: int, sent_s: float, start: float
) -> RequestResult:
    first: float | None = None
    last: float | None = None
    gaps: list[float] = []
    num_chunks = 0
    usage_tokens: int | None = None
    finished_at: float | None = None
    async for line in aiter_lines(resp):  # on \n only: U+2028 may be in a token
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            if (first is None or last is None) and finished_at is not None:
                # Every token decoded to no text (a special token, sampled with ignore_eos: ids
                # 0 and 1 of a tiny model's vocabulary): the chunk that finished carried them.
                first = last = finished_at
                num_chunks = 1
            if first is None or last is None:
                return _failure(index, n, sent_s, "no_tokens", 200, "stream ended without tokens")
            num_tokens = usage_tokens if usage_tokens is not None else num_chunks
            return RequestResult(
                index,
                n,
                True,
                None,
                200,
                sent_s,
                first - start,
                last - start,
                num_tokens,
                tuple(gaps),
            )
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            return _failure(index, n, sent_s, "bad_sse", 200, data)
        if obj.get("error"):
            return _failure(index, n, sent_s, "stream_error", 200, _message(data))
        if obj.get("usage"):
            usage_tokens = obj["usage"].get("completion_tokens")
        choices = obj.get("choices") or ()
        if finished_at is None and any(c.get("finish_reason") for c in choices):
            finished_at = time.perf_counter()
        if any(_has_token(choice) for choice in choices):
            now = time.perf_counter()
            if first is None:
                first = now
            elif last is not None:
                gaps.append(now - last)
            last = now
            num_chunks += 1
    return _failure(index, n, sent_s, "incomplete_stream", 200, "stream closed before [DONE]")


def _has_token(choice: dict[str, Any]) -> bool:
    if choice.get("text") or choice.get("token_ids"):
        return True
    delta = choice.get("delta") or {}
    return bool(delta.get("content"))


def _message(text: str) -> str:
    try:
        error = json.loads(text)["error"]
        return str(error.get("message", error)) if isinstance(error, dict) else str(error)
    except (json.JSONDecodeError, KeyError, TypeError):
        return text
