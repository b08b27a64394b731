"""``KvBytes``: ``CacheSpec.bytes_for`` (``S_kv``) in closed form, for the simulator's hot path.

``CacheSpec.bytes_for`` sums over every layer (61 for the paper's model), several times per
request. Grouped by kind it is ``fixed + n * per_token + sum_w min(n, w) * per_token_w`` over the
distinct sliding windows ``w``: a handful of operations. A sliding-window layer holds at most
``w`` tokens, so a short prompt is charged its own length there, not the whole window.
``tests/unit/sim/test_sim_kv_bytes.py`` checks it equals ``bytes_for`` for every preset. Pure.
"""

from __future__ import annotations

from prfaas.spec.cache_spec import CacheSpec, LayerKind


class KvBytes:
    """Bytes of a request's cache, and of what must cross to a site holding a prefix of it."""

    __slots__ = ("fixed_bytes", "linear", "num_layers", "per_token_bytes", "windows")

    def __init__(self, cache: CacheSpec) -> None:
        self.fixed_bytes = cache.fixed_bytes
        """Linear-attention states: independent of length."""
        self.per_token_bytes = cache.full_attention_bytes_per_token
        """Full-attention KV per token (every token is kept)."""
        windows: dict[int, int] = {}
        for layer in cache.layers:
            if layer.kind is LayerKind.SWA:
                assert layer.window_tokens is not None  # CacheSpec validates SWA windows
                w = layer.window_tokens
                windows[w] = windows.get(w, 0) + layer.bytes_per_token
        self.windows: tuple[tuple[int, int], ...] = tuple(sorted(windows.items()))
        """``(window_tokens, bytes per token over all layers with that window)``."""
        self.num_layers = cache.num_layers
        self.linear = not self.windows
        """No sliding window: ``total(n)`` is ``fixed_bytes + n * per_token_bytes`` (the hot
        paths inline it)."""

    def total(self, num_tokens: int) -> int:
        """``S_kv(num_tokens)``: equals ``CacheSpec.bytes_for(num_tokens)``."""
        n = self.fixed_bytes + num_tokens * self.per_token_bytes
        if self.windows:
            for window, per_token in self.windows:
                n += (num_tokens if num_tokens < window else window) * per_token
        return n

    def to_send(self, num_tokens: int, num_cached_tokens: int) -> int:
        """What crosses to a site already holding ``num_cached_tokens`` of the prompt: the
        uncached suffix of full-attention KV, the sliding windows and linear states as of
        ``num_tokens`` (``CacheSpec.transfer_bytes``)."""
        n = self.fixed_bytes + (num_tokens - num_cached_tokens) * self.per_token_bytes
        if self.windows:
            for window, per_token in self.windows:
                n += (num_tokens if num_tokens < window else window) * per_token
        return n
