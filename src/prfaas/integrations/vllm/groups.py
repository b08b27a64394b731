"""``CacheGroups``: what both sides of the connector need to know about vLLM's KV cache groups
(which layer is in which group, the groups holding linear-layer states, whether states cross).

Read once from vLLM's ``KVCacheConfig`` when the connector is made. Imports vllm lazily (the
``MambaSpec`` check), not torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

HYBRID_ENV = "PRFAAS_VLLM_HYBRID_STATES"
"""Set to 0 in a vLLM server's environment to never send/install linear-attention states
(they cross by default where vLLM keeps one state block per request: prefix caching off)."""


@dataclass(frozen=True, slots=True)
class CacheGroups:
    single_group: bool
    state_groups: dict[int, int]
    """Group index -> block size of the groups holding linear-layer (mamba) states."""
    group_of: dict[str, int]
    """vLLM layer name -> its group index."""
    group_block_size: dict[int, int]
    group_specs: dict[int, Any]
    """Group index -> vLLM's ``KVCacheSpec`` of the group."""
    mamba_mode: str
    hybrid_on: bool
    """States cross: vLLM's ``mamba_cache_mode`` is "none" and ``HYBRID_ENV`` is not 0."""

    @property
    def backoff(self) -> int:
        """Prompt tokens the prefill side leaves out: the decode side recomputes the last prompt
        token, and with states the state after it cannot be rewound, so the prefill stops one
        token short."""
        return 1 if self.state_groups and self.hybrid_on else 0

    @classmethod
    def of(cls, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig | None) -> CacheGroups:
        from vllm.v1.kv_cache_interface import MambaSpec

        groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
        # States cross only with one state block per request (mamba_cache_mode "none", i.e.
        # --no-enable-prefix-caching): in "align" mode (prefix caching) vLLM keeps a state per
        # block of tokens and moves them between blocks itself, which the connector does not
        # follow. Elsewhere every remote load of a hybrid model fails and recomputes.
        mode = str(getattr(vllm_config.cache_config, "mamba_cache_mode", "none"))
        return cls(
            single_group=len(groups) <= 1,
            state_groups={
                i: int(g.kv_cache_spec.block_size)
                for i, g in enumerate(groups)
                if isinstance(g.kv_cache_spec, MambaSpec)
            },
            group_of={name: i for i, g in enumerate(groups) for name in g.layer_names},
            group_block_size={i: int(g.kv_cache_spec.block_size) for i, g in enumerate(groups)},
            group_specs={i: g.kv_cache_spec for i, g in enumerate(groups)},
            mamba_mode=mode,
            hybrid_on=mode == "none" and os.environ.get(HYBRID_ENV) != "0",
        )
