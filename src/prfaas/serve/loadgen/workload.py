"""Bench workloads: when each request arrives, how long its prompt is, and the prompt itself.

Synthetic: Poisson or uniform arrivals at ``rate_rps``, prompt lengths from
``prfaas.analytic.TruncatedLogNormal``. Trace: a Mooncake JSONL (arrival ms, input/output length,
block hash ids), time-compressed by ``rate_scale``. Prompts are synthesised on demand and
deterministically: a trace's block ``h`` always becomes the same 512 tokens, so requests sharing
hash ids share a real prefix (prefix caches hit); synthetic prompts are unique per request.
Randomness comes from the seed only. The trace reader is this module's only I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prfaas.analytic import TruncatedLogNormal

BLOCK_TOKENS = 512
ARRIVALS = ("poisson", "uniform")
PROMPT_FORMATS = ("tokens", "text")
# Common English words that are one token in most BPE vocabularies: a text prompt of n words is
# then roughly n tokens on any model (exact lengths need prompt_format="tokens").
_WORDS_TEXT = (
    "the of and to in is that it was for on are as with his they at be this from have or by "
    "one had not but what all were when we there can an your which their said if do will each "
    "about how up out them then she many some so these would other into has more her two like "
    "him see time could no make than first been its who now people my made over did down only "
    "way find"
)
WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())


@dataclass(frozen=True, slots=True)
class BenchRequest:
    index: int
    arrival_s: float
    """Offset from the start of the run."""
    num_prompt_tokens: int
    max_tokens: int
    block_hashes: tuple[int, ...] = ()
    """Trace blocks (prefix identity); empty: a prompt unique to this request."""


@dataclass(frozen=True, slots=True)
class PromptSynth:
    """Turns a ``BenchRequest`` into prompt token ids (or words), deterministically."""

    seed: int = 0
    vocab_size: int = 256
    prompt_format: str = "tokens"
    block_tokens: int = BLOCK_TOKENS
    """Tokens one hash id stands for (the trace's 512; a workload of its own may use the
    engine's prefix-cache block, so prompts share exactly what that cache can reuse)."""

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(
                f"prompt format must be one of {PROMPT_FORMATS}, got {self.prompt_format!r}"
            )

    def token_ids(self, req: BenchRequest) -> list[int]:
        n = req.num_prompt_tokens
        parts: list[np.ndarray] = []
        block = self.block_tokens
        for h in req.block_hashes[: -(-n // block)]:
            rng = np.random.default_rng([self.seed, 0, h])
            parts.append(rng.integers(0, self.vocab_size, block))
        have = len(parts) * block
        if have < n:  # no (or too few) hash ids: tokens unique to this request
            rng = np.random.default_rng([self.seed, 1, req.index])
            parts.append(rng.integers(0, self.vocab_size, n - have))
        return [int(t) for t in np.concatenate(parts)[:n]]

    def prompt(self, req: BenchRequest) -> list[int] | str:
        ids = self.token_ids(req)
        if self.prompt_format == "tokens":
            return ids
        return " ".join(WORDS[t % len(WORDS)] for t in ids)


def _bounded(
    times: Iterator[float], num_requests: int | None, duration_s: float | None
) -> Iterator[tuple[int, float]]:
    for i, t in enumerate(times):
        if num_requests is not None and i >= num_requests:
            return
        if duration_s is not None and t >= duration_s:
            return
        yield i, t


def synthetic_workload(
    *,
    rate_rps: float,
    arrival: str,
    lengths: TruncatedLogNormal,
    num_output_tokens: int,
    num_requests: int | None,
    duration_s: float | None,
    seed: int,
) -> list[BenchRequest]:
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival must be one of {ARRIVALS}, got {arrival!r}")
    if not rate_rps > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate_rps}")
    if num_requests is None and duration_s is None:
        raise ValueError("give a number of requests or a duration")
    time_rng = np.random.default_rng([seed, 2])
    length_rng = np.random.default_rng([seed, 3])

    def times() -> Iterator[float]:
        t, i = 0.0, 0
        while True:
            if arrival == "uniform":
                yield i / rate_rps
            else:
                yield t
                t += float(time_rng.exponential(1.0 / rate_rps))
            i += 1

    arrivals = list(_bounded(times(), num_requests, duration_s))
    num_tokens = [int(n) for n in lengths.sample(length_rng, len(arrivals))] if arrivals else []
    return [
        BenchRequest(i, t, n, num_output_tokens)
        for (i, t), n in zip(arrivals, num_tokens, strict=True)
    ]


def trace_workload(
    path: Path,
    *,
    rate_scale: float,
    num_requests: int | None,
    duration_s: float | None,
    num_output_tokens: int | None,
) -> list[BenchRequest]:
    """Requests of a Mooncake JSONL trace; arrival times divided by ``rate_scale``. Errors name
    the file and line (``ValueError``)."""
    if not rate_scale > 0:
        raise ValueError(f"rate scale must be > 0, got {rate_scale}")
    out: list[BenchRequest] = []
    with path.open(encoding="utf-8") as f:
        rows = (line for line in f if line.strip())
        for number, line in enumerate(rows, start=1):
            req = _trace_row(line, f"{path}:{number}", len(out), rate_scale, num_output_tokens)
            if (num_requests is not None and len(out) >= num_requests) or (
                duration_s is not None and req.arrival_s >= duration_s
            ):
                break
            out.append(req)
    if not out:
        raise ValueError(f"{path}: no requests (empty trace, or none within the bounds)")
    return out


def _trace_row(
    line: str, where: str, index: int, rate_scale: float, num_output_tokens: int | None
) -> BenchRequest:
    try:
        row = json.loads(line)
        ts_ms, n_in, n_out = row["timestamp"], row["input_length"], row["output_length"]
        hashes = tuple(row.get("hash_ids", ()))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{where}: not a Mooncake trace row ({type(exc).__name__}: {exc})"
        ) from None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n_in, n_out, *hashes)):
        raise ValueError(f"{where}: input_length, output_length and hash_ids must be integers")
    if not isinstance(ts_ms, int | float) or ts_ms < 0 or n_in < 1:
        raise ValueError(f"{where}: need timestamp >= 0 and input_length >= 1, got {ts_ms}, {n_in}")
    max_tokens = num_output_tokens if num_output_tokens is not None else max(1, n_out)
    return BenchRequest(index, ts_ms / 1000.0 / rate_scale, n_in, max_tokens, hashes)
