"""``run_soak``: ordinary use, all at once, with the official ``openai`` client: completions and
chat, streaming and not, many concurrent, some clients hanging up (before the first token and
after it), copies of one greedy prompt sent concurrently (their text must equal a sequential run
of the same prompt: no cross-request mixing), and a fault injected midway (the caller's
``midway``: kill a node, restart it). Every request ends completed, hung up on purpose, or failed
with the reason the client saw; nothing here raises for a failed request.

Used by ``bench/soak.py`` (long runs) and the e2e soak test (a short one). Threads, not asyncio:
the ``openai`` client's sync API is what most users call.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

KINDS = ("completions", "completions_stream", "chat", "chat_stream")


@dataclass(frozen=True, slots=True)
class SoakConfig:
    model: str
    num_requests: int = 200
    concurrency: int = 48
    max_tokens: int = 12
    prompt_words: tuple[int, int] = (4, 60)
    """Random prompts of this many words (min, max)."""
    hangup_every: int = 7
    """Every n-th request's client hangs up (alternately before and after its first token)."""
    identical_every: int = 9
    """Every n-th request is the greedy reference prompt."""
    reference_prompt: str = "The quick brown fox jumps over the lazy dog because"
    api_key: str = "unused"
    timeout_s: float = 60.0
    seed: int = 0


@dataclass
class SoakResult:
    sent: int = 0
    completed: int = 0
    hung_up: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    """Failure reasons the client saw (HTTP status and the error message's head)."""
    unexplained: int = 0
    """Failures that came without a reason (an empty error message): must stay 0."""
    reference_text: dict[str, str] = field(default_factory=dict)
    """The reference prompt's greedy answer from a lone request, per API (chat applies the
    template, so its prompt differs)."""
    reference_copies: int = 0
    reference_mismatches: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "completed": self.completed,
            "hung_up": self.hung_up,
            "failed": sum(self.failed.values()),
            "failure_reasons": dict(self.failed),
            "unexplained_failures": self.unexplained,
            "reference_copies": self.reference_copies,
            "reference_mismatches": len(self.reference_mismatches),
            "wall_s": round(self.wall_s, 1),
        }


def run_soak(
    base_url: str, config: SoakConfig, midway: Callable[[], None] | None = None
) -> SoakResult:
    import openai

    client = openai.OpenAI(
        base_url=f"{base_url}/v1", api_key=config.api_key, max_retries=0, timeout=config.timeout_s
    )
    result = SoakResult()
    lock = threading.Lock()
    result.reference_text = {
        api: _complete(client, config, config.reference_prompt, chat=api == "chat")
        for api in ("completions", "chat")
    }
    rng = random.Random(config.seed)
    prompts = [_prompt(rng, config, i) for i in range(config.num_requests)]
    started = time.monotonic()

    def one(i: int) -> None:
        outcome, detail = _one(client, base_url, config, i, prompts[i])
        with lock:
            result.sent += 1
            if outcome == "completed":
                result.completed += 1
                if prompts[i] == config.reference_prompt:
                    result.reference_copies += 1
                    api = "chat" if KINDS[i % len(KINDS)].startswith("chat") else "completions"
                    if detail != result.reference_text[api]:
                        result.reference_mismatches.append(detail)
            elif outcome == "hung_up":
                result.hung_up += 1
            else:
                result.failed[detail] += 1
                if not detail.split(":", 1)[-1].strip():
                    result.unexplained += 1

    with ThreadPoolExecutor(config.concurrency) as pool:
        half = config.num_requests // 2
        futures = [pool.submit(one, i) for i in range(half)]
        if midway is not None:
            for f in futures[: half // 2]:
                f.result()
            midway()
        futures += [pool.submit(one, i) for i in range(half, config.num_requests)]
        for f in futures:
            f.result()
    result.wall_s = time.monotonic() - started
    client.close()
    return result


def _prompt(rng: random.Random, config: SoakConfig, i: int) -> str:
    if config.identical_every and i % config.identical_every == 0:
        return config.reference_prompt
    words = rng.randint(*config.prompt_words)
    return " ".join(f"w{rng.randrange(10_000)}" for _ in range(words))


def _complete(client: Any, config: SoakConfig, prompt: str, chat: bool) -> str:
    common = {"model": config.model, "max_tokens": config.max_tokens, "temperature": 0}
    if chat:
        messages = [{"role": "user", "content": prompt}]
        r = client.chat.completions.create(messages=messages, **common)
        return str(r.choices[0].message.content)
    r = client.completions.create(prompt=prompt, **common)
    return str(r.choices[0].text)


def _one(client: Any, base_url: str, config: SoakConfig, i: int, prompt: str) -> tuple[str, str]:
    """("completed", text) | ("hung_up", "") | ("failed", reason)."""
    import openai

    kind = KINDS[i % len(KINDS)]
    hangup = config.hangup_every and i % config.hangup_every == config.hangup_every - 1
    try:
        if hangup and (i // config.hangup_every) % 2 == 0:
            return _hang_up_before_first_token(base_url, config, prompt)
        chat = kind.startswith("chat")
        stream = kind.endswith("stream") or bool(hangup)
        kwargs: dict[str, Any] = {
            "model": config.model,
            "max_tokens": config.max_tokens,
            "temperature": 0,
            "stream": stream,
        }
        if chat:
            call = client.chat.completions.create
            kwargs["messages"] = [{"role": "user", "content": prompt}]
        else:
            call = client.completions.create
            kwargs["prompt"] = prompt
        if stream:
            kwargs["stream_options"] = {"include_usage": True}
        r = call(**kwargs)
        if not stream:
            choice = r.choices[0]
            return "completed", str(choice.message.content if chat else choice.text)
        parts: list[str] = []
        for chunk in r:
            if hangup:
                r.close()  # the client goes away after its first token
                return "hung_up", ""
            for choice in chunk.choices:
                piece = choice.delta.content if chat else choice.text
                parts.append(piece or "")
        return "completed", "".join(parts)
    except openai.APIStatusError as exc:
        return "failed", f"{exc.status_code}: {_message(exc.body)}"
    except openai.APIError as exc:  # connection errors, errors inside a stream
        return "failed", f"{type(exc).__name__}: {exc}"


def _hang_up_before_first_token(base_url: str, config: SoakConfig, prompt: str) -> tuple[str, str]:
    body = {"model": config.model, "prompt": prompt, "max_tokens": config.max_tokens}
    headers = {"Authorization": f"Bearer {config.api_key}"}
    try:
        httpx.post(f"{base_url}/v1/completions", json=body, headers=headers, timeout=0.005)
    except httpx.TimeoutException:
        return "hung_up", ""
    except httpx.HTTPError as exc:
        return "failed", f"{type(exc).__name__}: {exc}"
    return "hung_up", ""  # answered within 5 ms, before the client gave up


def _message(body: object) -> str:
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message", ""))[:120]
    return str(body)[:120]
