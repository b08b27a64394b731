"""spec: what a deployment is made of: models (with their per-layer caches) and hardware.

Pure data and arithmetic; imports only ``core``-free standard library. No I/O, no torch, no asyncio.
"""

from prfaas.spec.cache_spec import (
    CacheLayout,
    CacheSpec,
    LayerCache,
    LayerKind,
    LayerSegment,
    TensorSlice,
    TensorSpec,
)
from prfaas.spec.dtype import DType
from prfaas.spec.hardware import HardwareSpec
from prfaas.spec.model_spec import ModelSpec
from prfaas.spec.presets import get_hardware, get_model, hardware_names, model_names

__all__ = [
    "CacheLayout",
    "CacheSpec",
    "DType",
    "HardwareSpec",
    "LayerCache",
    "LayerKind",
    "LayerSegment",
    "ModelSpec",
    "TensorSlice",
    "TensorSpec",
    "get_hardware",
    "get_model",
    "hardware_names",
    "model_names",
]
