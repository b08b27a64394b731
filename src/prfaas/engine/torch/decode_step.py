"""One decode step of the running batch, as the engine thread runs it: the batched forward (the
running requests' caches combined into one left-padded batch, one token each, handed back one
token longer; on the CPU into buffers kept between steps, ``batch_workspace``), a
failing batch stepped one request at a time so only the requests that fail alone fail, and one
token sampled per request (``Running``: what a decoding request carries between steps).

Owns the step's arithmetic and its per-request failures; the tables, the lock and which requests
step are the engine's (``engine.py``). Never imports the engine, no asyncio.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from prfaas.engine.api import FinishReason, SamplingParams, TokenEvent
from prfaas.engine.hf_spec import HFCacheMap
from prfaas.engine.torch import hf_cache
from prfaas.engine.torch.batch_workspace import BatchWorkspace
from prfaas.engine.torch.core import EngineFault
from prfaas.engine.torch.forward_clock import ForwardClock
from prfaas.engine.torch.loader import LoadedModel
from prfaas.engine.torch.sampling import choose

Stepped = tuple[hf_cache.RequestCache, torch.Tensor]
"""A request's cache advanced by one token, and its last logits."""


@dataclass(slots=True)
class Running:
    cache: hf_cache.RequestCache
    sampling: SamplingParams
    stop_ids: frozenset[int]
    last_token: int
    num_generated: int
    seen: torch.Tensor | None
    """``bool [vocab]`` of prompt + output ids, kept only for a repetition penalty."""


def finish_reason(run: Running, token: int) -> FinishReason | None:
    if token in run.stop_ids:
        return FinishReason.STOP
    if run.num_generated >= run.sampling.max_new_tokens:
        return FinishReason.LENGTH
    return None


def forward_step(
    loaded: LoadedModel,
    cmap: HFCacheMap,
    runs: list[Running],
    workspace: BatchWorkspace | None = None,
    clock: ForwardClock | None = None,
) -> list[Stepped]:
    """One batched decode forward: per request, its advanced cache and last logits. The batch's
    caches are gathered into ``workspace``'s buffers where one is given (``batch_workspace``);
    the forward pass alone (what the profile's decode curve prices) is counted on ``clock``."""
    rows = runs
    if len(rows) == 1 and loaded.batch_invariant:
        rows = rows * 2  # a one-row step takes another GEMM kernel (see hf_cache)
    cache, max_tokens = hf_cache.build_cache(loaded.model, cmap, [r.cache for r in rows], workspace)
    lengths = [r.cache.num_tokens for r in rows]
    # Left-padded batch: request b's tokens end at index max_tokens; mask the padding.
    mask = torch.zeros((len(rows), max_tokens + 1), dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, max_tokens - n :] = 1
    input_ids = torch.tensor([[r.last_token] for r in rows], dtype=torch.long)
    positions = torch.tensor([[n] for n in lengths], dtype=torch.long)
    timing = contextlib.nullcontext() if clock is None else clock.timing()
    with loaded.forward_lock, torch.inference_mode(), timing:
        logits = hf_cache.forward(loaded.model, input_ids, cache, positions, mask)
    if workspace is None:
        caches = hf_cache.split_cache(cache, cmap, [n + 1 for n in lengths])
    else:  # a duplicated row (rows = runs * 2) must not append twice: runs only
        remaining = [r.sampling.max_new_tokens - r.num_generated for r in runs]
        caches = hf_cache.append_step(cache, cmap, [r.cache for r in runs], remaining)
    return [(caches[b], logits[b, -1]) for b in range(len(runs))]


def isolate(
    forward: Callable[[list[Running]], list[Stepped]], runs: list[Running], exc: Exception
) -> list[Stepped | Exception]:
    """A batched step raised: step each request alone, so only the requests that fail
    alone fail. If every one of several fails alone too, it is the engine: stop it."""
    if len(runs) == 1:
        return [exc]
    out: list[Stepped | Exception] = []
    for run in runs:
        try:
            out.extend(forward([run]))
        except Exception as alone:
            out.append(alone)
    if all(isinstance(o, Exception) for o in out):
        raise EngineFault(
            f"a decode step of {len(runs)} requests failed, each one alone too: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return out


def sample_tokens(
    batch: Sequence[tuple[str, Running]], stepped: Sequence[Stepped | Exception]
) -> list[TokenEvent]:
    """Per request of the step, in order: its advanced cache kept and one token sampled (its
    event), or an error event for a request whose forward or sampling failed."""
    events: list[TokenEvent] = []
    for (rid, run), out in zip(batch, stepped, strict=True):
        if isinstance(out, Exception):
            events.append(error_event(rid, "decode step", out))
            continue
        run.cache, logits = out
        try:
            token = choose(logits, run.sampling, run.num_generated, run.stop_ids, run.seen)
        except Exception as exc:
            events.append(error_event(rid, "sampling", exc))
            continue
        run.num_generated += 1
        run.last_token = token
        if run.seen is not None and 0 <= token < run.seen.shape[0]:
            run.seen[token] = True
        events.append(TokenEvent(rid, (token,), finish_reason(run, token)))
    return events


def error_event(request_id: str, what: str, exc: Exception) -> TokenEvent:
    return TokenEvent(
        request_id, (), FinishReason.ERROR, error=f"{what}: {type(exc).__name__}: {exc}"
    )
