"""``prfaas.engine``: model execution behind one interface, real (``engine.torch``) or emulated
(``engine.timed``, the cost model's time on an injected clock). See ``docs/engine.md``.

The interface (both engines):
- ``prefill_stream(PrefillRequest)``: async iterator of ``LayerOutput`` (layer ``i`` of the
  request's cache, laid out as ``CacheSpec.layout`` says, handed out as soon as it is computed),
  then one ``PrefillResult`` (the first generated token, block-aligned ``CachedPrefix``
  checkpoints when asked). A request may start from a ``CachedPrefix``: only the suffix is computed.
- ``allocate(manifest, max_new_tokens) -> Allocation``: writable per-layer buffers an incoming
  transfer lands in, or a refusal (``ManifestMismatch``, ``PromptTooLong``, ``BudgetExceeded``).
- ``install(allocation, first_token, sampling, prefix)`` -> first ``TokenEvent``; the request joins
  the running batch. ``release(request_id)`` drops anything held.
- ``step_async()`` -> ``TokenEvent`` s of one decode step of every running request (continuous
  batching: requests join and leave between steps).

Importing this package does not import torch (only ``prfaas.engine.torch`` does).
``cache_map_from_config`` derives a Hugging Face model's ``CacheSpec`` from its config.
"""

from prfaas.engine.api import (
    DEFAULT_BLOCK_TOKENS,
    Allocation,
    CachedPrefix,
    Engine,
    FinishReason,
    LayerOutput,
    ManifestLike,
    PrefillRequest,
    PrefillResult,
    SamplingParams,
    TokenEvent,
)
from prfaas.engine.budget import KvBudget
from prfaas.engine.errors import (
    BudgetExceeded,
    EngineDead,
    EngineError,
    ManifestMismatch,
    ModelFolderError,
    PromptTooLong,
    UnknownArchitecture,
    UnknownRequest,
)
from prfaas.engine.hf_spec import (
    SUPPORTED_ARCHITECTURES,
    HFCacheMap,
    cache_map_from_config,
    check_architecture,
)
from prfaas.engine.manifest_check import LayoutManifest, check_manifest

__all__ = [
    "DEFAULT_BLOCK_TOKENS",
    "SUPPORTED_ARCHITECTURES",
    "Allocation",
    "BudgetExceeded",
    "CachedPrefix",
    "Engine",
    "EngineDead",
    "EngineError",
    "FinishReason",
    "HFCacheMap",
    "KvBudget",
    "LayerOutput",
    "LayoutManifest",
    "ManifestLike",
    "ManifestMismatch",
    "ModelFolderError",
    "PrefillRequest",
    "PrefillResult",
    "PromptTooLong",
    "SamplingParams",
    "TokenEvent",
    "UnknownArchitecture",
    "UnknownRequest",
    "cache_map_from_config",
    "check_architecture",
    "check_manifest",
]
