"""vLLM's Prometheus ``/metrics`` text as the figures a node reports: requests running (the batch)
and waiting (the queue), KV cache usage, and the cache's size (``vllm:cache_config_info``). Pure:
parses text, reads no socket (the host fetches the page). Must not import vllm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def parse_samples(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (``# ...`` lines skipped; a line that does
    not parse is skipped too: one odd metric must not cost the node its report)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        sample = _parse_line(line)
        if sample is not None:
            out.append(sample)
    return out


def _parse_line(line: str) -> Sample | None:
    labels: tuple[tuple[str, str], ...] = ()
    if "{" in line:
        name, _, rest = line.partition("{")
        body, sep, tail = rest.rpartition("}")
        if not sep:
            return None
        labels = _parse_labels(body)
    else:
        name, _, tail = line.partition(" ")
    fields = tail.split()
    if not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return Sample(name.strip(), labels, value)


def _parse_labels(body: str) -> tuple[tuple[str, str], ...]:
    """``a="x",b="y \\"q\\""`` -> pairs (escapes: backslash, quote, newline)."""
    pairs = []
    i = 0
    while i < len(body):
        eq = body.find("=", i)
        if eq < 0 or eq + 1 >= len(body) or body[eq + 1] != '"':
            break
        key = body[i:eq].strip().lstrip(",").strip()
        j = eq + 2
        value = []
        while j < len(body) and body[j] != '"':
            if body[j] == "\\" and j + 1 < len(body):
                j += 1
                value.append("\n" if body[j] == "n" else body[j])
            else:
                value.append(body[j])
            j += 1
        pairs.append((key, "".join(value)))
        i = j + 1
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class VllmLoad:
    """One server's load, summed over its engines (data-parallel ranks)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    """Share of the KV cache in use, 0..1."""
    num_blocks: int = 0
    """KV cache blocks (``vllm:cache_config_info`` num_gpu_blocks; 0: not said)."""
    block_tokens: int = 0
    kv_cache_bytes: int = 0
    """The cache's size as the server says it (``kv_cache_memory_bytes``: set on CPU servers
    from ``VLLM_CPU_KVCACHE_SPACE``; 0: not said)."""
    num_steps: int = 0
    """Engine steps since the server started (``vllm:iteration_tokens_total``'s count: one
    sample per step, each running the decode batch beside any prefill chunk)."""


def vllm_load(text: str) -> VllmLoad:
    running = waiting = 0.0
    usage: list[float] = []
    num_blocks = block_tokens = cache_bytes = 0
    steps = 0.0
    for s in parse_samples(text):
        if math.isnan(s.value):
            continue
        if s.name == "vllm:num_requests_running":
            running += s.value
        elif s.name == "vllm:num_requests_waiting":
            waiting += s.value
        elif s.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            usage.append(s.value)
        elif s.name == "vllm:iteration_tokens_total_count":
            steps += s.value
        elif s.name == "vllm:cache_config_info":
            labels = dict(s.labels)
            num_blocks += _int(labels.get("num_gpu_blocks"))
            block_tokens = block_tokens or _int(labels.get("block_size"))
            cache_bytes += _int(labels.get("kv_cache_memory_bytes"))
    return VllmLoad(
        num_running=int(running),
        num_waiting=int(waiting),
        kv_cache_usage=min(1.0, max(0.0, sum(usage) / len(usage))) if usage else 0.0,
        num_blocks=num_blocks,
        block_tokens=block_tokens,
        kv_cache_bytes=cache_bytes,
        num_steps=int(steps),
    )


def _int(text: str | None) -> int:
    if text is None:
        return 0
    try:
        return int(text)
    except ValueError:  # "None", "": not said
        return 0


def kv_bytes_per_token(hf_config: Mapping[str, object], dtype: str) -> int:
    """K and V bytes per token of a dense attention model's config.json (0 when it does not say
    enough: the caller falls back to the configured cache size)."""
    cfg = hf_config.get("text_config", hf_config)
    if not isinstance(cfg, Mapping):
        return 0
    layers = cfg.get("num_hidden_layers")
    heads = cfg.get("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim")
    hidden = cfg.get("hidden_size")
    if not isinstance(head_dim, int) and isinstance(hidden, int) and isinstance(heads, int):
        head_dim = hidden // heads if heads else None
    if not all(isinstance(x, int) and x > 0 for x in (layers, kv_heads, head_dim)):
        return 0
    assert isinstance(layers, int) and isinstance(kv_heads, int) and isinstance(head_dim, int)
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES.get(dtype, 2)


def kv_capacity_bytes(load: VllmLoad, bytes_per_token: int, configured_gib: int) -> int:
    """The server's KV cache size: as it says it, else blocks x tokens x bytes per token when the
    server and the model say, else the configured ``kv_cache_space_gib``."""
    if load.kv_cache_bytes:
        return load.kv_cache_bytes
    if load.num_blocks and load.block_tokens and bytes_per_token:
        return load.num_blocks * load.block_tokens * bytes_per_token
    return configured_gib * GIB
