"""Roofline estimates over ``spec/``: FLOPs and bytes of prefill and decode on one instance.

Prefill FLOPs = 2 x active params per new token (the dense matmuls)
  + full-attention layers (GQA/MLA): 4 x heads x head_dim per (query, key) pair, causal, so
    4*H*d*(n*c + n*(n+1)/2) for n new tokens after c cached ones: quadratic in length;
  + sliding-window layers: the same per pair but each query sees at most W keys: linear in length;
  + linear/SSM layers: 4 x state elements per token (state update + readout): linear in length.
Time = the hardware's fixed prefill overhead
  + max(FLOPs / (peak x efficiency), weights read once / (HBM x efficiency)).

Decode step (batch B, total context C over the batch) = max(weight reads, dense FLOPs) + KV reads,
where weight reads are min(params, active x B) x bytes/param (MoE: more experts touched as the batch
grows) and KV reads are B x (linear states + SWA windows) + C x full-attention bytes per token. SWA
windows are charged full (contexts are assumed longer than the window). The step is linear in C,
which gives ``decode_span_s`` a closed form. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prfaas.spec.cache_spec import LayerKind
from prfaas.spec.hardware import HardwareSpec
from prfaas.spec.model_spec import ModelSpec


def _swa_pairs(num_new: int, num_cached: int, window: int) -> float:
    """Sum over new query positions p in [c, c+n) of min(p + 1, W): keys each query attends."""
    lo, hi = num_cached + 1, num_cached + num_new  # attended keys = position + 1, capped at W
    below = max(0, min(hi, window) - lo + 1)  # queries whose count p+1 <= W
    first = lo
    last = lo + below - 1
    ramp = (first + last) * below / 2 if below > 0 else 0.0
    return ramp + (num_new - below) * window


def prefill_flops(model: ModelSpec, num_new: int, num_cached: int = 0) -> float:
    n, c = float(num_new), float(num_cached)
    flops = 2.0 * model.active_params * n
    per_pair = 4.0 * model.num_attention_heads * model.attention_head_dim
    for layer in model.cache.layers:
        if layer.kind in (LayerKind.GQA, LayerKind.MLA):
            flops += per_pair * (n * c + n * (n + 1) / 2)
        elif layer.kind is LayerKind.SWA:
            assert layer.window_tokens is not None
            flops += per_pair * _swa_pairs(num_new, num_cached, layer.window_tokens)
        else:
            state = layer.fixed[0]
            flops += 4.0 * math.prod(state.shape) * n
    return flops


@dataclass(frozen=True, slots=True)
class Roofline:
    model: ModelSpec
    hardware: HardwareSpec

    @property
    def _flops_per_s(self) -> float:
        return self.hardware.instance_flops * self.hardware.efficiency

    @property
    def _bytes_per_s(self) -> float:
        return self.hardware.instance_hbm_bytes_per_s * self.hardware.efficiency

    def prefill_s(self, num_new: int, num_cached: int = 0) -> float:
        compute_s = prefill_flops(self.model, num_new, num_cached) / self._flops_per_s
        weights_s = self.model.weight_bytes / self._bytes_per_s
        return self.hardware.prefill_overhead_s + max(compute_s, weights_s)

    def _per_request_state_bytes(self) -> float:
        total = 0.0
        for layer in self.model.cache.layers:
            if layer.kind is LayerKind.LINEAR:
                total += layer.fixed_bytes
            elif layer.kind is LayerKind.SWA:
                assert layer.window_tokens is not None
                total += layer.window_tokens * layer.bytes_per_token
        return total

    def decode_step_parts(self, batch_size: int) -> tuple[float, float]:
        """(seconds independent of context, seconds per context token) of one decode step."""
        m = self.model
        weights = min(m.params, m.active_params * batch_size) * m.weight_bytes_per_param
        weights_s = weights / self._bytes_per_s
        dense_s = 2.0 * m.active_params * batch_size / self._flops_per_s
        states_s = batch_size * self._per_request_state_bytes() / self._bytes_per_s
        per_token_s = m.cache.full_attention_bytes_per_token / self._bytes_per_s
        return max(weights_s, dense_s) + states_s, per_token_s
